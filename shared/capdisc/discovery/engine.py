"""The per-turn discovery pipeline: retrieve, re-rank on the graph, assemble budgeted tiers.

Pure: a snapshot, a query (text, vector, filters) and a config in, a :class:`DiscoveryResult`
out. The discovery worker, the meta-tool handler and the benchmarks all run this same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from capdisc.access import ANONYMOUS, Caller
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.graph import rerank
from capdisc.discovery.snapshot import Hit, IndexSnapshot
from capdisc.discovery.tiers import TieredContext, tier1_text, tier2_text
from capdisc.embedders.port import CachedQueryEmbedder, Matrix, Vector
from capdisc.filters import SearchFilters
from capdisc.models import Capability
from capdisc.registry.flags import Mark
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.entities import annotate
from capdisc.retrieval.index import QueryEmbed
from capdisc.tokens import make_counter

#: How many retrieval candidates per final slot the graph may reorder.
CANDIDATE_FACTOR = 2


@dataclass(frozen=True)
class Query:
    """What one turn asks: the text and its filters."""

    text: str
    limit: int | None = None
    filters: SearchFilters = field(default_factory=SearchFilters)
    #: Capabilities ranked first whenever they are relevant (an agent profile's expert tools).
    prefer: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Match:
    """One capability in an answer, with its tier (1 or 2) and why it is there."""

    capability: Capability
    score: float
    relevance: float
    tier: int = 1
    reason: str = ""
    #: Set when the tool-poisoning scan flagged it and it is served anyway
    #: (:mod:`capdisc.registry.flags`): the answer's ``flags`` (rule codes and where, never
    #: the excerpts).
    mark: Mark | None = None

    def to_dict(self) -> dict[str, Any]:
        cap = self.capability
        entry: dict[str, Any] = {
            "id": cap.id,
            "kind": cap.kind,
            "name": cap.name,
            "display_name": cap.display_name,
            "description": cap.description,
            "category": cap.category,
            "available": cap.available,
            "score": round(self.score, 4),
            "relevance": round(self.relevance, 4),
            "tier": self.tier,
        }
        if self.reason:
            entry["reason"] = self.reason
        if self.mark is not None:
            entry["flags"] = self.mark.to_list()
        return entry


@dataclass(frozen=True)
class DiscoveryResult:
    """What one turn gets: ranked matches, the rendered tiers and the index version used."""

    query: str
    tenant: str
    index_version: int
    matches: tuple[Match, ...]
    tiers: TieredContext
    total_indexed: int
    abstained: bool = False
    #: Category -> workflow guidance for the categories of the matches, in the order the
    #: categories first appear (docs/design.md, "Workflow hints").
    workflow_hints: Mapping[str, str] = field(default_factory=dict)

    @property
    def context(self) -> str:
        return self.tiers.render()

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "tenant": self.tenant,
            "index_version": self.index_version,
            "abstained": self.abstained,
            "capabilities": [m.to_dict() for m in self.matches],
            "context": self.context,
            "tiers": {
                "tier0": self.tiers.tier0,
                "tier1": self.tiers.tier1,
                "tier2": self.tiers.tier2,
            },
            "tokens": dict(self.tiers.tokens),
            "total_indexed": self.total_indexed,
            "workflow_hints": dict(self.workflow_hints),
        }


@dataclass(frozen=True)
class Ranking:
    """Retrieval and graph re-ranking of one query, before the tiers are assembled."""

    matches: tuple[Match, ...]
    abstained: bool

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(m.capability.id for m in self.matches)


def discover(
    snapshot: IndexSnapshot,
    query: Query,
    query_vector: Vector,
    config: DiscoveryConfig,
    embed: QueryEmbed | None = None,
) -> DiscoveryResult:
    """Run the whole pipeline for one turn. ``embed`` embeds sub-queries of a query that
    chains several requests (without it the query is not decomposed)."""
    limit = query.limit if query.limit is not None else config.tier1_top_k
    ranking = rank(snapshot, query, query_vector, config, limit, embed)
    tiers = assemble(
        snapshot, [m.capability for m in ranking.matches], config, query.filters.caller
    )
    tier2, shown = set(tiers.tier2_ids), set(tiers.tier1_ids)
    matches = tuple(
        replace(m, tier=2 if m.capability.id in tier2 else 1)
        for m in ranking.matches
        if m.capability.id in shown
    )
    return DiscoveryResult(
        query=query.text,
        tenant=snapshot.tenant,
        index_version=snapshot.version,
        matches=matches,
        tiers=tiers,
        total_indexed=len(snapshot),
        abstained=ranking.abstained,
        workflow_hints=hints_for(matches, config.workflow_hints),
    )


def hints_for(matches: tuple[Match, ...], hints: Mapping[str, str]) -> dict[str, str]:
    """The workflow guidance of the matches' categories, first-seen order, empty ones left out."""
    found: dict[str, str] = {}
    for match in matches:
        category = match.capability.category
        if category not in found and hints.get(category, "").strip():
            found[category] = hints[category].strip()
    return found


def rank(
    snapshot: IndexSnapshot,
    query: Query,
    query_vector: Vector,
    config: DiscoveryConfig,
    limit: int,
    embed: QueryEmbed | None = None,
) -> Ranking:
    """The ``limit`` best matches: hybrid retrieval, the minimum relevance, graph re-ranking.
    Empty, and ``abstained``, when retrieval says nothing fits."""
    retrieved = snapshot.retriever.search(
        query.text, query_vector, limit * CANDIDATE_FACTOR, query.filters, config, embed
    )
    matches = (
        ()
        if retrieved.abstained
        else _rank(snapshot, retrieved.hits, config, limit, retrieved.exact_match, query)
    )
    return Ranking(matches, retrieved.abstained)


def _rank(
    snapshot: IndexSnapshot,
    hits: tuple[Hit, ...],
    config: DiscoveryConfig,
    limit: int,
    exact: str | None,
    query: Query,
) -> tuple[Match, ...]:
    """Hits above the minimum relevance, re-ranked on the graph; a capability the query named
    stays first whatever its relevance, then the preferred (expert) ones. Capabilities the
    graph pulls in pass the query's filters like every hit did (its caller's visibility
    first): a relationship never shows what the caller may not see or did not ask for."""
    prefer = query.prefer
    relevant = [h for h in hits if h.relevance >= config.tier1_min_relevance or h.id == exact]
    relevance = {h.id: h.relevance for h in relevant}
    if config.use_graph_reranking and relevant:
        ordered = rerank(
            [(h.id, h.score) for h in relevant], snapshot.graph, config.graph_boost_factor
        )
        triples = [(r.id, r.score, r.reason) for r in ordered]
    else:
        triples = [(h.id, h.score, "") for h in relevant]
    if exact is not None or prefer:
        triples.sort(key=lambda t: (t[0] != exact, t[0] not in prefer))  # stable
    caps, marks = snapshot.capabilities, snapshot.marks
    matches: list[Match] = []
    for i, score, reason in triples:  # each read (parsed) only until ``limit`` are admitted
        if len(matches) == limit:
            break
        capability = caps.get(i)
        if capability is not None and query.filters.admits(capability):
            matches.append(
                Match(capability, score, relevance.get(i, 0.0), reason=reason, mark=marks.get(i))
            )
    return tuple(matches)


def assemble(
    snapshot: IndexSnapshot,
    ranked: list[Capability],
    config: DiscoveryConfig,
    caller: Caller = ANONYMOUS,
) -> TieredContext:
    """Tier 0 (of what ``caller`` may see) from the snapshot's cache, Tiers 1 and 2 for the
    ranked capabilities (flagged ones under ``warn`` with their caution)."""
    counter = make_counter(config.token_counter)
    tier0 = snapshot.tier0(config.tier0_budget_tokens, config.token_counter, caller)
    cautions = {
        c.id: mark.caution_text
        for c in ranked
        if (mark := snapshot.marks.get(c.id)) is not None and mark.caution
    }
    tier1, tier1_ids = tier1_text(
        ranked, config.workflow_hints, config.tier1_budget_tokens, counter, cautions
    )
    shown = [c for c in ranked if c.id in set(tier1_ids)][: config.tier2_top_k]
    tier2, tier2_ids = tier2_text(shown, config.tier2_budget_tokens, counter, cautions)
    tokens = {"tier0": counter(tier0), "tier1": counter(tier1), "tier2": counter(tier2)}
    tokens["total"] = sum(tokens.values())
    return TieredContext(tier0, tier1, tier2, tier1_ids, tier2_ids, tokens)


def embed_turn(
    queries: CachedQueryEmbedder, text: str, config: DiscoveryConfig
) -> tuple[Vector, QueryEmbed]:
    """The query vector of one turn and the embedder :func:`discover` asks for sub-queries: the
    sub-queries decomposition will find are embedded with the query and cached with it, each
    on its own or, in a request of more than ``pooled_parts_above`` parts, pooled from the
    query's own model pass (late chunking: one model call for a long chained request; an
    implied step such as "write a file", not a span of the text, is still embedded on its
    own)."""
    if config.entity_types:
        text = annotate(text)
    parts: list[str] = []
    if config.decompose_queries and config.fusion == "zscore":
        found = decompose(text, DEFAULT_CONFIG.max_subqueries, implied=config.entity_types)
        parts = found if len(found) > 1 else []
    pooled = len(parts) > config.pooled_parts_above
    vector, rows = queries.embed_with_parts(text, parts, pooled=pooled)
    known = dict(zip(parts, rows, strict=False))

    def embed(texts: list[str]) -> Matrix:
        missing = [t for t in texts if t not in known]
        if missing:
            known.update(zip(missing, queries.embed_many(missing), strict=True))
        return np.stack([known[t] for t in texts]).astype(np.float32)

    return vector, embed


def render_for_prompt(result: DiscoveryResult) -> str:
    """The text to put in the agent's prompt: Tier 0 first (cacheable), then Tiers 1 and 2."""
    return result.context
