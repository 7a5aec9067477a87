"""The per-turn discovery pipeline: rank a snapshot for a query and render the answer.

Pure: a snapshot, a query vector and a config in, a :class:`DiscoveryResult` out. This is the
skeleton's plain dense top-k; hybrid retrieval, graph re-ranking and tiered budgets build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capdisc.embedding import Vector
from capdisc.index import IndexSnapshot
from capdisc.models import Capability
from capdisc.settings import DiscoveryConfig


@dataclass(frozen=True)
class Match:
    """One ranked capability in an answer."""

    capability: Capability
    score: float

    def to_dict(self) -> dict[str, Any]:
        cap = self.capability
        return {"id": cap.id, "kind": cap.kind, "name": cap.name,
                "display_name": cap.display_name, "description": cap.description,
                "category": cap.category, "available": cap.available,
                "score": round(self.score, 4)}


@dataclass(frozen=True)
class DiscoveryResult:
    """What one turn gets: ranked matches, the rendered context and the index version used."""

    query: str
    tenant: str
    index_version: int
    matches: tuple[Match, ...]
    context: str
    total_indexed: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "tenant": self.tenant, "index_version": self.index_version,
                "capabilities": [m.to_dict() for m in self.matches], "context": self.context,
                "total_indexed": self.total_indexed, **self.extra}


def discover(snapshot: IndexSnapshot, query: str, query_vector: Vector, config: DiscoveryConfig,
             limit: int | None = None, kind: str | None = None) -> DiscoveryResult:
    """Dense top-k above ``tier1_min_relevance``, rendered as a compact capability list."""
    k = limit if limit is not None else config.tier1_top_k
    ranked = snapshot.search(query_vector, k, kind=kind)
    matches = tuple(Match(cap, score) for cap, score in ranked
                    if score >= config.tier1_min_relevance)
    return DiscoveryResult(query=query, tenant=snapshot.tenant, index_version=snapshot.version,
                           matches=matches, context=render(matches),
                           total_indexed=len(snapshot))


def render(matches: tuple[Match, ...]) -> str:
    """The text an agent's prompt gets for these matches."""
    if not matches:
        return "No registered capability matches this request."
    lines = ["Relevant capabilities:"]
    for rank, match in enumerate(matches, start=1):
        cap = match.capability
        params = f" Params: {', '.join(cap.parameter_names)}" if cap.parameter_names else ""
        lines.append(f"{rank}. {cap.name} ({cap.kind}). {cap.description}{params}")
    return "\n".join(lines)
