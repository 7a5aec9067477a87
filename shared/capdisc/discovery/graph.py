"""The capability graph and graph re-ranking.

Edges are built deterministically from metadata:

=================  ==================================================  ===================
edge type          from                                                weight
=================  ==================================================  ===================
``DEPENDS_ON``     ``required_tools``, ``depends_on`` relationships    1.0
``COMPOSED_WITH``  ``composed_with`` and ``related`` relationships     0.5
``TAGGED_WITH``    two or more shared tags                             0.3 per shared tag
``SAME_CATEGORY``  the same ``kind:category``, in groups of 2 to 8     0.1
=================  ==================================================  ===================

A tag carried by more than :data:`MAX_TAG_GROUP` capabilities says little about any pair of them
and would make the graph quadratic, so it does not count towards ``TAGGED_WITH``.

:func:`rerank`: a result whose neighbour is also a result gets
``boost_factor * weight`` added (mutual boost); a ``DEPENDS_ON`` or ``COMPOSED_WITH`` neighbour
that is not a result is pulled in at ``parent_score * boost_factor * weight``; then re-sort.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

import networkx as nx

from capdisc.models import Capability

DEPENDS_ON = "DEPENDS_ON"
COMPOSED_WITH = "COMPOSED_WITH"
TAGGED_WITH = "TAGGED_WITH"
SAME_CATEGORY = "SAME_CATEGORY"
WEIGHTS = {DEPENDS_ON: 1.0, COMPOSED_WITH: 0.5, TAGGED_WITH: 0.3, SAME_CATEGORY: 0.1}
PULL_TYPES = frozenset({DEPENDS_ON, COMPOSED_WITH})
MIN_SHARED_TAGS = 2
CATEGORY_GROUP = (2, 8)
MAX_TAG_GROUP = 50

_RELATION_EDGE = {
    "depends_on": DEPENDS_ON,
    "composed_with": COMPOSED_WITH,
    "related": COMPOSED_WITH,
}


@dataclass(frozen=True)
class Ranked:
    """A capability id with its score and, when the graph changed it, why."""

    id: str
    score: float
    reason: str = ""


def build_graph(capabilities: Iterable[Capability]) -> nx.Graph:
    """The undirected capability graph; each edge has ``weight`` and the set of ``types``."""
    caps = sorted(capabilities, key=lambda c: c.id)
    graph = nx.Graph()
    graph.add_nodes_from(c.id for c in caps)
    by_name = {c.name: c.id for c in caps}
    for cap in caps:
        for target in cap.required_tools:
            _add(graph, cap.id, by_name.get(target, target), DEPENDS_ON)
        for relation in cap.relationships:
            target = by_name.get(relation.target, relation.target)
            _add(graph, cap.id, target, _RELATION_EDGE[relation.type])
    _add_tag_edges(graph, caps)
    _add_category_edges(graph, caps)
    return graph


def _add(graph: nx.Graph, a: str, b: str, edge_type: str, weight: float | None = None) -> None:
    if a == b or b not in graph:
        return
    if graph.has_edge(a, b):
        data = graph[a][b]
        if edge_type in data["types"] and edge_type != TAGGED_WITH:
            return
        data["types"] = data["types"] | {edge_type}
        data["weight"] += WEIGHTS[edge_type] if weight is None else weight
    else:
        graph.add_edge(
            a,
            b,
            types=frozenset({edge_type}),
            weight=WEIGHTS[edge_type] if weight is None else weight,
        )


def _add_tag_edges(graph: nx.Graph, caps: Sequence[Capability]) -> None:
    by_tag: dict[str, list[str]] = defaultdict(list)
    for cap in caps:
        for tag in set(cap.tags):
            by_tag[tag].append(cap.id)
    shared: dict[tuple[str, str], int] = defaultdict(int)
    for members in by_tag.values():
        if len(members) <= MAX_TAG_GROUP:
            for pair in combinations(sorted(members), 2):
                shared[pair] += 1
    for (a, b), count in sorted(shared.items()):
        if count >= MIN_SHARED_TAGS:
            _add(graph, a, b, TAGGED_WITH, WEIGHTS[TAGGED_WITH] * count)


def _add_category_edges(graph: nx.Graph, caps: Sequence[Capability]) -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for cap in caps:
        groups[f"{cap.kind}:{cap.category}"].append(cap.id)
    low, high = CATEGORY_GROUP
    for members in groups.values():
        if low <= len(members) <= high:
            for a, b in combinations(sorted(members), 2):
                _add(graph, a, b, SAME_CATEGORY)


def rerank(
    results: Sequence[tuple[str, float]], graph: nx.Graph, boost_factor: float
) -> list[Ranked]:
    """Boost results connected to other results, pull in dependencies, re-sort (stable)."""
    if boost_factor <= 0:
        return [Ranked(cap_id, score) for cap_id, score in results]
    scores = dict(results)
    reasons: dict[str, str] = {}
    pulled: dict[str, float] = {}
    for cap_id, score in results:
        if cap_id not in graph:
            continue
        for neighbour, data in graph[cap_id].items():
            if neighbour in scores:
                scores[cap_id] += boost_factor * data["weight"]
                reasons.setdefault(cap_id, f"related to {neighbour}")
            elif data["types"] & PULL_TYPES:
                pull = score * boost_factor * _pull_weight(data["types"])
                if pull > pulled.get(neighbour, 0.0):
                    pulled[neighbour] = pull
                    reasons[neighbour] = f"pulled in by {cap_id}"
    order = {cap_id: index for index, (cap_id, _s) in enumerate(results)}
    ranked = [Ranked(i, s, reasons.get(i, "")) for i, s in scores.items()]
    ranked += [Ranked(i, s, reasons[i]) for i, s in sorted(pulled.items())]
    ranked.sort(key=lambda r: (-r.score, order.get(r.id, len(order)), r.id))
    return ranked


def _pull_weight(types: frozenset[str]) -> float:
    return max(WEIGHTS[t] for t in types & PULL_TYPES)
