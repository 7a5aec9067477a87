"""The in-process index of one tenant: capabilities, vectors, a retriever, the graph, Tier 0.

An :class:`IndexSnapshot` never changes: :meth:`IndexSnapshot.with_changes` returns a new one,
built completely (retriever and graph included) before a discovery worker swaps it in, so a
request never sees a half-applied update and never pays for a rebuild.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import networkx as nx
import numpy as np

from capdisc.embedding import Matrix, Vector
from capdisc.graph import build_graph
from capdisc.models import Capability
from capdisc.settings import DiscoveryConfig
from capdisc.tiers import tier0_text
from capdisc.tokens import make_counter


@dataclass(frozen=True)
class SearchFilters:
    """Pre-filters: only capabilities that pass are ranked at all."""

    kind: str | None = None
    category: str | None = None
    tags: tuple[str, ...] = ()
    only_available: bool = False

    def admits(self, cap: Capability) -> bool:
        return ((self.kind is None or cap.kind == self.kind)
                and (self.category is None or cap.category == self.category)
                and all(tag in cap.tags for tag in self.tags)
                and (cap.available or not self.only_available))


@dataclass(frozen=True)
class Hit:
    """One retrieved capability: its ranking score and a calibrated 0..1 relevance."""

    id: str
    score: float
    relevance: float


@dataclass(frozen=True)
class Retrieved:
    """Retrieval's answer: ranked hits, or an abstention when nothing is relevant."""

    hits: tuple[Hit, ...]
    abstained: bool = False


class Retriever(Protocol):
    """Port: ranks the capabilities of one snapshot for a query."""

    def search(self, query: str, query_vector: Vector, k: int, filters: SearchFilters,
               config: DiscoveryConfig) -> Retrieved: ...


class DenseRetriever:
    """Exact cosine search over the snapshot's matrix; relevance is the cosine itself."""

    def __init__(self, ids: tuple[str, ...], capabilities: Mapping[str, Capability],
                 matrix: Matrix) -> None:
        self._ids = ids
        self._caps = capabilities
        self._matrix = matrix

    def search(self, query: str, query_vector: Vector, k: int, filters: SearchFilters,
               config: DiscoveryConfig) -> Retrieved:
        if not self._ids or k <= 0:
            return Retrieved(())
        scores = self._matrix @ query_vector.astype(np.float32)
        if filters != SearchFilters():
            mask = np.array([filters.admits(self._caps[i]) for i in self._ids])
            scores = np.where(mask, scores, -np.inf)
        k = min(k, len(self._ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        hits = tuple(Hit(self._ids[i], float(scores[i]), float(scores[i]))
                     for i in top if np.isfinite(scores[i]))
        return Retrieved(hits)


@dataclass(frozen=True)
class IndexSnapshot:
    """One tenant's searchable state at one index version."""

    tenant: str
    version: int
    dim: int
    ids: tuple[str, ...] = ()
    capabilities: Mapping[str, Capability] = field(default_factory=dict)
    matrix: Matrix = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    retriever: Retriever = field(default=None, repr=False)  # type: ignore[assignment]
    graph: nx.Graph = field(default_factory=nx.Graph, repr=False)
    _tier0: dict[tuple[int, str], str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, tenant: str, version: int, dim: int,
              entries: Iterable[tuple[Capability, bytes]]) -> IndexSnapshot:
        caps: dict[str, Capability] = {}
        rows: dict[str, Vector] = {}
        for capability, vector in entries:
            if len(vector) != dim * 4:
                continue  # a vector of another model or size: left for a reindex
            caps[capability.id] = capability  # a repeated id: the later entry wins
            rows[capability.id] = np.frombuffer(vector, dtype=np.float32)
        matrix = (np.vstack(list(rows.values())) if rows
                  else np.zeros((0, dim), dtype=np.float32))
        ids = tuple(caps)
        return cls(tenant, version, dim, ids, caps, matrix, make_retriever(ids, caps, matrix),
                   build_graph(caps.values()))

    def __len__(self) -> int:
        return len(self.ids)

    def with_changes(self, version: int, upserts: Iterable[tuple[Capability, bytes]],
                     deletes: Iterable[str]) -> IndexSnapshot:
        """A new snapshot at ``version`` with ``upserts`` replaced or added and ``deletes`` gone."""
        entries = {cid: (self.capabilities[cid], self.matrix[i].tobytes())
                   for i, cid in enumerate(self.ids)}
        for cap_id in deletes:
            entries.pop(cap_id, None)
        for capability, vector in upserts:
            entries[capability.id] = (capability, vector)
        return IndexSnapshot.build(self.tenant, version, self.dim, entries.values())

    def search(self, query: Vector, k: int, kind: str | None = None
               ) -> list[tuple[Capability, float]]:
        """Plain dense top-``k`` (optionally of one ``kind``), best first."""
        found = DenseRetriever(self.ids, self.capabilities, self.matrix).search(
            "", query, k, SearchFilters(kind=kind), DiscoveryConfig())
        return [(self.capabilities[h.id], h.score) for h in found.hits]

    def tier0(self, budget_tokens: int, counter_name: str) -> str:
        """Tier 0 for this snapshot, computed once per budget and counter."""
        key = (budget_tokens, counter_name)
        if key not in self._tier0:
            self._tier0[key] = tier0_text(self.capabilities.values(), budget_tokens,
                                          make_counter(counter_name))
        return self._tier0[key]


def make_retriever(ids: tuple[str, ...], capabilities: Mapping[str, Capability],
                   matrix: Matrix) -> Any:
    """The retriever a snapshot ranks with."""
    return DenseRetriever(ids, capabilities, matrix)
