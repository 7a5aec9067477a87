"""The capability graph: edges from metadata, and re-ranking."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any, cast

import networkx as nx
import pytest

from capdisc.discovery.graph import (
    COMPOSED_WITH,
    DEPENDS_ON,
    MAX_TAG_GROUP,
    SAME_CATEGORY,
    TAGGED_WITH,
    WEIGHTS,
    Ranked,
    build_graph,
    rerank,
)
from capdisc.models import Capability, Kind, Relationship, RelationType

Edges = dict[tuple[str, str], tuple[frozenset[str], Any]]


def cap(
    cap_id: str,
    *,
    category: str | None = None,
    tags: Sequence[str] = (),
    requires: Sequence[str] = (),
    relations: Sequence[tuple[str, RelationType]] = (),
) -> Capability:
    """A capability whose category is its own id unless given, so no SAME_CATEGORY edge appears
    by accident."""
    kind, name = cap_id.split(":", 1)
    return Capability(
        id=cap_id,
        kind=cast(Kind, kind),
        name=name,
        description=f"About {name}.",
        category=category if category is not None else cap_id,
        tags=tuple(tags),
        required_tools=tuple(requires),
        relationships=tuple(Relationship(t, r) for t, r in relations),
    )


def edges_of(graph: nx.Graph) -> Edges:
    return {
        (min(a, b), max(a, b)): (data["types"], data["weight"])
        for a, b, data in graph.edges(data=True)
    }


def edge(types: Sequence[str], weight: float) -> tuple[frozenset[str], Any]:
    """An expected edge: its exact types and its weight up to float rounding."""
    return frozenset(types), pytest.approx(weight)


# -- build_graph ---------------------------------------------------------------------------------

BUILD_CASES: dict[str, tuple[list[Capability], Edges]] = {
    "required tool by id": (
        [cap("skill:github", requires=["tool:cli"]), cap("tool:cli")],
        {("skill:github", "tool:cli"): edge([DEPENDS_ON], 1.0)},
    ),
    "required tool by name": (
        [cap("skill:github", requires=["cli"]), cap("tool:cli")],
        {("skill:github", "tool:cli"): edge([DEPENDS_ON], 1.0)},
    ),
    "depends_on relationship": (
        [cap("tool:a", relations=[("tool:b", "depends_on")]), cap("tool:b")],
        {("tool:a", "tool:b"): edge([DEPENDS_ON], 1.0)},
    ),
    "composed_with relationship": (
        [
            cap("tool:web-search", relations=[("skill:summarizer", "composed_with")]),
            cap("skill:summarizer"),
        ],
        {("skill:summarizer", "tool:web-search"): edge([COMPOSED_WITH], 0.5)},
    ),
    "related relationship": (
        [cap("tool:a", relations=[("tool:b", "related")]), cap("tool:b")],
        {("tool:a", "tool:b"): edge([COMPOSED_WITH], 0.5)},
    ),
    "relationship by name": (
        [cap("tool:a", relations=[("b", "composed_with")]), cap("skill:b")],
        {("skill:b", "tool:a"): edge([COMPOSED_WITH], 0.5)},
    ),
    "dependency declared both ways counts once": (
        [cap("tool:a", requires=["tool:b"]), cap("tool:b", requires=["tool:a"])],
        {("tool:a", "tool:b"): edge([DEPENDS_ON], 1.0)},
    ),
    "composed_with and related on one pair count once": (
        [
            cap("tool:a", relations=[("tool:b", "composed_with"), ("tool:b", "related")]),
            cap("tool:b", relations=[("tool:a", "related")]),
        ],
        {("tool:a", "tool:b"): edge([COMPOSED_WITH], 0.5)},
    ),
    "two shared tags": (
        [cap("tool:a", tags=["web", "search", "x"]), cap("tool:b", tags=["search", "web", "y"])],
        {("tool:a", "tool:b"): edge([TAGGED_WITH], 0.6)},
    ),
    "three shared tags": (
        [cap("tool:a", tags=["p", "q", "r"]), cap("tool:b", tags=["r", "q", "p"])],
        {("tool:a", "tool:b"): edge([TAGGED_WITH], 0.9)},
    ),
    "one shared tag makes no edge": (
        [cap("tool:a", tags=["web", "x"]), cap("tool:b", tags=["web", "y"])],
        {},
    ),
    "same kind and category, group of two": (
        [cap("tool:a", category="info"), cap("tool:b", category="info")],
        {("tool:a", "tool:b"): edge([SAME_CATEGORY], 0.1)},
    ),
    "same category but different kind makes no edge": (
        [cap("tool:a", category="info"), cap("skill:b", category="info")],
        {},
    ),
    "depends_on and composed_with summed": (
        [
            cap("tool:a", requires=["tool:b"], relations=[("tool:b", "composed_with")]),
            cap("tool:b"),
        ],
        {("tool:a", "tool:b"): edge([DEPENDS_ON, COMPOSED_WITH], 1.5)},
    ),
    "every type summed on one edge": (
        [
            cap(
                "tool:a",
                category="c",
                tags=["s", "t"],
                requires=["tool:b"],
                relations=[("tool:b", "related")],
            ),
            cap("tool:b", category="c", tags=["s", "t"]),
        ],
        {
            ("tool:a", "tool:b"): edge(
                [DEPENDS_ON, COMPOSED_WITH, TAGGED_WITH, SAME_CATEGORY], 1.0 + 0.5 + 0.6 + 0.1
            )
        },
    ),
    "unknown targets are ignored": (
        [
            cap(
                "tool:a",
                requires=["tool:missing", "missing"],
                relations=[("nowhere", "related"), ("tool:gone", "depends_on")],
            )
        ],
        {},
    ),
    "self references are ignored": (
        [cap("tool:a", requires=["tool:a", "a"], relations=[("tool:a", "composed_with")])],
        {},
    ),
    "edges only between the capabilities named": (
        [cap("skill:s", requires=["tool:a"]), cap("tool:a"), cap("tool:b"), cap("tool:c")],
        {("skill:s", "tool:a"): edge([DEPENDS_ON], 1.0)},
    ),
}


@pytest.mark.parametrize(("caps", "expected"), list(BUILD_CASES.values()), ids=list(BUILD_CASES))
def test_build_graph_edges(caps: list[Capability], expected: Edges) -> None:
    assert edges_of(build_graph(caps)) == expected


def test_edge_weights_are_the_seed_table() -> None:
    assert WEIGHTS == {DEPENDS_ON: 1.0, COMPOSED_WITH: 0.5, TAGGED_WITH: 0.3, SAME_CATEGORY: 0.1}


def test_every_capability_is_a_node_and_unknown_targets_are_not() -> None:
    graph = build_graph([cap("tool:a", requires=["tool:missing"]), cap("tool:b")])
    assert sorted(graph.nodes) == ["tool:a", "tool:b"]


def test_empty_catalog_gives_an_empty_graph() -> None:
    graph = build_graph([])
    assert (graph.number_of_nodes(), graph.number_of_edges()) == (0, 0)


@pytest.mark.parametrize(
    ("size", "linked"), [(1, False), (2, True), (3, True), (8, True), (9, False)]
)
def test_same_category_links_every_pair_only_in_groups_of_two_to_eight(
    size: int, linked: bool
) -> None:
    ids = [f"tool:t{i}" for i in range(size)]
    expected = {pair: edge([SAME_CATEGORY], 0.1) for pair in combinations(ids, 2)} if linked else {}
    assert edges_of(build_graph([cap(i, category="shared") for i in ids])) == expected


@pytest.mark.parametrize(
    ("group_size", "expected"),
    [
        (MAX_TAG_GROUP, {("tool:a", "tool:b"): edge([TAGGED_WITH], 0.6)}),
        (MAX_TAG_GROUP + 1, {}),
    ],
)
def test_tags_carried_by_more_than_max_tag_group_capabilities_are_ignored(
    group_size: int, expected: Edges
) -> None:
    # tool:a and tool:b share "rare" and "common"; "common" is on group_size capabilities.
    caps = [cap("tool:a", tags=["rare", "common"]), cap("tool:b", tags=["rare", "common"])]
    caps += [cap(f"tool:other{i:02}", tags=["common"]) for i in range(group_size - 2)]
    assert edges_of(build_graph(caps)) == expected


def test_graph_is_the_same_for_any_input_order() -> None:
    caps = [
        cap("skill:g", category="c", tags=["x", "y"], requires=["tool:cli"]),
        cap("tool:cli", category="c", tags=["x", "y"]),
        cap("tool:web", relations=[("skill:g", "related")]),
    ]
    forward, backward = build_graph(caps), build_graph(list(reversed(caps)))
    assert edges_of(forward) == edges_of(backward)
    assert {n: list(forward[n]) for n in forward} == {n: list(backward[n]) for n in backward}


def test_a_repeated_tag_is_still_one_shared_tag() -> None:
    caps = [cap("tool:a", tags=["web", "web"]), cap("tool:b", tags=["web"])]
    assert edges_of(build_graph(caps)) == {}


# -- rerank --------------------------------------------------------------------------------------

GraphEdge = tuple[str, str, Sequence[str]]


def graph_of(edges: Sequence[GraphEdge], nodes: Sequence[str] = ()) -> nx.Graph:
    """A graph shaped like build_graph's: each edge has its types and their summed weight."""
    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    for a, b, types in edges:
        graph.add_edge(a, b, types=frozenset(types), weight=sum(WEIGHTS[t] for t in types))
    return graph


# Scores and factors are binary fractions where it matters, so sums are exact and ties are real.
RERANK_CASES: dict[
    str, tuple[list[tuple[str, float]], list[GraphEdge], float, list[tuple[str, float]]]
] = {
    "no edges keeps order and scores": (
        [("a", 0.75), ("b", 0.5)],
        [],
        0.5,
        [("a", 0.75), ("b", 0.5)],
    ),
    "mutual boost on both ends": (
        [("a", 0.75), ("b", 0.5)],
        [("a", "b", [COMPOSED_WITH])],
        0.5,
        [("a", 1.0), ("b", 0.75)],
    ),
    "mutual boost reorders": (
        [("a", 0.75), ("b", 0.5), ("c", 0.375)],
        [("b", "c", [DEPENDS_ON])],
        0.5,
        [("b", 1.0), ("c", 0.875), ("a", 0.75)],
    ),
    "mutual boost uses the summed edge weight": (
        [("a", 0.5), ("b", 0.25)],
        [("a", "b", [TAGGED_WITH, SAME_CATEGORY])],
        0.25,
        [("a", 0.5 + 0.25 * 0.4), ("b", 0.25 + 0.25 * 0.4)],
    ),
    "mutual boost sums over every neighbour in the results": (
        [("a", 0.5), ("b", 0.25), ("c", 0.125)],
        [("a", "b", [DEPENDS_ON]), ("a", "c", [COMPOSED_WITH])],
        0.5,
        [("a", 1.25), ("b", 0.75), ("c", 0.375)],
    ),
    "pull in a DEPENDS_ON neighbour": (
        [("skill:github", 0.75)],
        [("skill:github", "tool:cli", [DEPENDS_ON])],
        0.5,
        [("skill:github", 0.75), ("tool:cli", 0.375)],
    ),
    "pull in a COMPOSED_WITH neighbour": (
        [("a", 0.75)],
        [("a", "c", [COMPOSED_WITH])],
        0.5,
        [("a", 0.75), ("c", 0.1875)],
    ),
    "no pull in of a TAGGED_WITH neighbour": (
        [("a", 0.75)],
        [("a", "t", [TAGGED_WITH])],
        0.5,
        [("a", 0.75)],
    ),
    "no pull in of a SAME_CATEGORY neighbour": (
        [("a", 0.75)],
        [("a", "s", [SAME_CATEGORY])],
        0.5,
        [("a", 0.75)],
    ),
    "pull in uses the pull type's weight, not the summed weight": (
        [("a", 0.75)],
        [("a", "d", [DEPENDS_ON, TAGGED_WITH, SAME_CATEGORY])],
        0.5,
        [("a", 0.75), ("d", 0.375)],
    ),
    "pull in over DEPENDS_ON and COMPOSED_WITH uses the larger weight": (
        [("a", 0.75)],
        [("a", "d", [DEPENDS_ON, COMPOSED_WITH])],
        0.5,
        [("a", 0.75), ("d", 0.375)],
    ),
    "pull in uses the parent's score before its boost": (
        [("a", 0.75), ("b", 0.5)],
        [("a", "b", [COMPOSED_WITH]), ("a", "d", [DEPENDS_ON])],
        0.5,
        [("a", 1.0), ("b", 0.75), ("d", 0.375)],
    ),
    "neighbour of two parents is pulled in at the larger pull": (
        [("a", 0.75), ("b", 0.5)],
        [("a", "d", [COMPOSED_WITH]), ("b", "d", [DEPENDS_ON])],
        0.5,
        [("a", 0.75), ("b", 0.5), ("d", 0.25)],
    ),
    "pulled in neighbours are ranked among the results": (
        [("a", 0.75), ("b", 0.25)],
        [("a", "d", [DEPENDS_ON])],
        0.5,
        [("a", 0.75), ("d", 0.375), ("b", 0.25)],
    ),
    "pulled in neighbour ranks after a result with the same score": (
        [("a", 0.75), ("b", 0.375)],
        [("a", "d", [DEPENDS_ON])],
        0.5,
        [("a", 0.75), ("b", 0.375), ("d", 0.375)],
    ),
    "pulled in neighbours with the same score rank by id": (
        [("a", 0.5)],
        [("a", "z", [DEPENDS_ON]), ("a", "m", [DEPENDS_ON])],
        0.5,
        [("a", 0.5), ("m", 0.25), ("z", 0.25)],
    ),
    "boost factor 0 leaves order and scores unchanged": (
        [("a", 0.75), ("b", 0.5), ("c", 0.25)],
        [("a", "b", [COMPOSED_WITH]), ("c", "b", [DEPENDS_ON]), ("a", "d", [DEPENDS_ON])],
        0.0,
        [("a", 0.75), ("b", 0.5), ("c", 0.25)],
    ),
    "boost factor 0 keeps even an unsorted input order": (
        [("b", 0.25), ("a", 0.75)],
        [("a", "b", [DEPENDS_ON])],
        0.0,
        [("b", 0.25), ("a", 0.75)],
    ),
    "ties keep the input order": (
        [("c", 0.5), ("a", 0.5), ("b", 0.5)],
        [],
        0.5,
        [("c", 0.5), ("a", 0.5), ("b", 0.5)],
    ),
    "ties after a boost keep the input order": (
        [("top", 0.75), ("a", 0.5), ("b", 0.5)],
        [("a", "b", [COMPOSED_WITH])],
        0.5,
        [("top", 0.75), ("a", 0.75), ("b", 0.75)],
    ),
    "unsorted input is sorted by score": (
        [("low", 0.25), ("high", 0.75)],
        [],
        0.5,
        [("high", 0.75), ("low", 0.25)],
    ),
    "a result absent from the graph is unchanged": (
        [("absent", 0.875), ("a", 0.75), ("b", 0.5)],
        [("a", "b", [DEPENDS_ON])],
        0.5,
        [("a", 1.25), ("b", 1.0), ("absent", 0.875)],
    ),
    "zero parent score pulls nothing in": (
        [("a", 0.0)],
        [("a", "d", [DEPENDS_ON])],
        0.5,
        [("a", 0.0)],
    ),
    "empty results": ([], [("a", "b", [DEPENDS_ON])], 0.5, []),
}


@pytest.mark.parametrize(
    ("results", "edges", "factor", "expected"), list(RERANK_CASES.values()), ids=list(RERANK_CASES)
)
def test_rerank(
    results: list[tuple[str, float]],
    edges: list[GraphEdge],
    factor: float,
    expected: list[tuple[str, float]],
) -> None:
    graph = graph_of(edges, nodes=[i for i, _s in results if i != "absent"])
    ranked = rerank(results, graph, factor)
    assert [r.id for r in ranked] == [i for i, _s in expected]
    assert [r.score for r in ranked] == pytest.approx([s for _i, s in expected])


def test_rerank_with_the_default_factor_on_a_two_tag_edge() -> None:
    graph = build_graph(
        [
            cap("tool:a", tags=["s", "t"], requires=["tool:d"]),
            cap("tool:b", tags=["s", "t"]),
            cap("tool:d"),
        ]
    )
    ranked = rerank([("tool:a", 0.9), ("tool:b", 0.6)], graph, 0.15)
    assert [r.id for r in ranked] == ["tool:a", "tool:b", "tool:d"]
    assert [r.score for r in ranked] == pytest.approx(
        [0.9 + 0.15 * 0.6, 0.6 + 0.15 * 0.6, 0.9 * 0.15 * 1.0]
    )


def test_rerank_on_a_built_graph_pulls_in_the_dependency() -> None:
    graph = build_graph(
        [
            cap("skill:github", requires=["cli-executor"]),
            cap("tool:cli-executor"),
            cap("tool:web-search"),
        ]
    )
    ranked = rerank([("skill:github", 0.8), ("tool:web-search", 0.4)], graph, 0.15)
    assert [(r.id, r.reason) for r in ranked] == [
        ("skill:github", ""),
        ("tool:web-search", ""),
        ("tool:cli-executor", "pulled in by skill:github"),
    ]
    assert [r.score for r in ranked] == pytest.approx([0.8, 0.4, 0.8 * 0.15])


# -- reasons -------------------------------------------------------------------------------------


def test_mutual_boost_reason_names_the_other_result_on_both_ends() -> None:
    ranked = rerank([("a", 0.75), ("b", 0.5)], graph_of([("a", "b", [COMPOSED_WITH])]), 0.5)
    assert [(r.id, r.reason) for r in ranked] == [("a", "related to b"), ("b", "related to a")]


def test_pulled_in_reason_names_the_parent() -> None:
    ranked = rerank([("a", 0.75)], graph_of([("a", "d", [DEPENDS_ON])]), 0.5)
    assert [(r.id, r.reason) for r in ranked] == [("a", ""), ("d", "pulled in by a")]


def test_pulled_in_reason_names_the_parent_with_the_larger_pull() -> None:
    graph = graph_of([("a", "d", [COMPOSED_WITH]), ("b", "d", [DEPENDS_ON])])
    ranked = rerank([("a", 0.75), ("b", 0.5)], graph, 0.5)
    assert ranked[-1] == Ranked("d", 0.25, "pulled in by b")


def test_equal_pulls_keep_the_first_parent_as_the_reason() -> None:
    graph = graph_of([("a", "d", [DEPENDS_ON]), ("b", "d", [DEPENDS_ON])])
    ranked = rerank([("a", 0.5), ("b", 0.5)], graph, 0.5)
    assert ranked[-1] == Ranked("d", 0.25, "pulled in by a")


def test_unchanged_results_have_no_reason() -> None:
    graph = graph_of([("a", "t", [TAGGED_WITH])], nodes=["b"])
    ranked = rerank([("a", 0.75), ("b", 0.5), ("absent", 0.25)], graph, 0.5)
    assert [r.reason for r in ranked] == ["", "", ""]


def test_boost_factor_zero_pulls_nothing_in() -> None:
    graph = graph_of([("a", "d", [DEPENDS_ON]), ("a", "c", [COMPOSED_WITH])])
    assert rerank([("a", 0.75)], graph, 0.0) == [Ranked("a", 0.75)]


def test_boost_factor_zero_gives_no_reasons() -> None:
    graph = graph_of([("a", "b", [COMPOSED_WITH])])
    ranked = rerank([("a", 0.75), ("b", 0.5)], graph, 0.0)
    assert [r.reason for r in ranked] == ["", ""]
