"""Search results and how they are assembled: the merged order of the whole query's and the
sub-queries' best rows (:func:`merge`), then each entry's score, relevance and evidence
(:func:`entries`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from capdisc.retrieval.config import RetrievalConfig
from capdisc.retrieval.lexical import IntArray, LexicalIndex, Scores
from capdisc.retrieval.relevance import relevance
from capdisc.retrieval.scoring import LexicalSide
from capdisc.retrieval.topk import BoolArray, top_rows


@dataclass(frozen=True)
class RankedCapability:
    """One ranked capability: its fused score (z units, higher is better), its calibrated
    relevance in [0, 1], and the evidence the relevance was computed from (dense cosine, BM25
    term coverage, fused z of the query text it matched best)."""

    capability_id: str
    score: float
    relevance: float
    evidence: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RetrievalResult:
    """Ranked entries, best first, and whether the retriever says nothing fits."""

    entries: tuple[RankedCapability, ...]
    abstained: bool
    subqueries: tuple[str, ...] = ()
    exact_match: str | None = None

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.capability_id for e in self.entries)


@dataclass(frozen=True)
class Scored:
    """One query text's scores on ``rows`` (all rows for the whole query, candidates for a
    sub-query)."""

    rows: IntArray | None  # None: every row, in catalog order
    cosine: Scores
    fused: Scores
    term_ids: IntArray  # the text's BM25 terms (coverage is computed for the final rows only)
    #: How the text's BM25 scores entered ``fused`` (the z-score mix only).
    lexical: LexicalSide | None = None
    #: The catalog mean and deviation its cosines were standardized with (the z-score mix of
    #: every row only): what an exact cosine's z-score replaces.
    dense: tuple[float, float] | None = None

    def positions(self, rows: Sequence[int]) -> list[int | None]:
        """The position of each catalog row of ``rows`` in these scores, None when it was not
        scored (one search of the sorted candidate rows for all)."""
        if self.rows is None:
            return list(rows)
        if not self.rows.size:
            return [None] * len(rows)
        asked = np.asarray(rows, dtype=np.int64)
        at = np.searchsorted(self.rows, asked)  # candidate rows are sorted (np.union1d)
        found = self.rows[np.minimum(at, self.rows.size - 1)] == asked
        return [int(a) if f else None for a, f in zip(at.tolist(), found.tolist(), strict=True)]


def best_rows(scored: Scored, allowed: BoolArray, k: int) -> list[int]:
    """Catalog rows of the ``k`` best allowed fused scores of ``scored``, best first."""
    if scored.rows is None:
        return top_rows(scored.fused, allowed, k)
    return [int(scored.rows[at]) for at in top_rows(scored.fused, allowed[scored.rows], k)]


def merge(
    ranking: list[int], parts: list[Scored], k: int, exact: int | None, config: RetrievalConfig
) -> list[int]:
    """Exact match first, then the whole query's best, then each confident sub-query's best
    (most confident first), then the whole query's ranking."""
    order: list[int] = [exact] if exact is not None else []
    reserved = ranking[:1]
    tops = []
    few = len(parts) <= config.few_parts
    min_z = min(config.subquery_min_z, config.few_parts_min_z) if few else config.subquery_min_z
    for part in parts:
        if part.fused.size and part.rows is not None:
            at = int(np.argmax(part.fused))
            if float(part.fused[at]) >= min_z:
                tops.append((float(part.fused[at]), int(part.rows[at])))
    reserved += [row for _, row in sorted(tops, key=lambda t: -t[0])]
    for row in [*reserved, *ranking]:
        if row not in order:
            order.append(row)
    return order[:k]


def entries(
    order: list[int],
    whole: Scored,
    parts: list[Scored],
    ids: Sequence[str],
    lexicon: LexicalIndex,
    config: RetrievalConfig,
    cosine_shift: float = 0.0,
) -> tuple[RankedCapability, ...]:
    """Entries for the rows of ``order`` (``ids`` names each row); each row's relevance comes
    from the query text (whole or sub-query) it scored best on, its cosine lowered by
    ``cosine_shift`` (the query's no-tool signal) for the relevance model only."""
    placed = _placed(whole, order)
    sources = _sources(order, whole, placed, parts)
    coverage = _coverage(order, sources, lexicon, config)
    scores = _non_increasing(whole.fused[placed].tolist())
    ranked = []
    for row, (scored, at), cov, score in zip(order, sources, coverage, scores, strict=True):
        evidence = (float(scored.cosine[at]), float(cov), float(scored.fused[at]))
        judged = (evidence[0] - cosine_shift, evidence[1], evidence[2])
        ranked.append(RankedCapability(ids[row], score, relevance(judged, config), evidence))
    return tuple(ranked)


def _placed(whole: Scored, order: list[int]) -> list[int]:
    """Each row's position in the whole query's scores (every ranked row has one)."""
    placed = whole.positions(order)
    missing = [row for row, at in zip(order, placed, strict=True) if at is None]
    if missing:
        raise ValueError(f"row {missing[0]} was not scored for the whole query")
    return cast(list[int], placed)


def _sources(
    order: list[int], whole: Scored, placed: list[int], parts: list[Scored]
) -> list[tuple[Scored, int]]:
    """Per row of ``order`` (at ``placed`` in ``whole``), the query text it scored best on and
    its position there."""
    sources: list[tuple[Scored, int]] = [(whole, at) for at in placed]
    for part in parts:
        for i, at in enumerate(part.positions(order)):
            best, best_at = sources[i]
            if at is not None and part.fused[at] > best.fused[best_at]:
                sources[i] = (part, at)
    return sources


def _coverage(
    order: list[int],
    sources: list[tuple[Scored, int]],
    lexicon: LexicalIndex,
    config: RetrievalConfig,
) -> Scores:
    """Per row of ``order``, the BM25 term coverage of its source text (zeros when the
    relevance model ignores coverage and no calibration run asks for it)."""
    coverage = np.zeros(len(order), dtype=np.float32)
    texts = {id(s): s for s, _ in sources}.values() if _wants_coverage(config) else ()
    for scored in texts:
        mine = [i for i, (s, _) in enumerate(sources) if s is scored]
        coverage[mine] = lexicon.coverage(scored.term_ids, [order[i] for i in mine])
    return coverage


def _wants_coverage(config: RetrievalConfig) -> bool:
    """BM25 term coverage is evidence for calibration; skipped when the model ignores it."""
    return config.relevance_coverage != 0.0 or config.collect_evidence


def _non_increasing(scores: list[float]) -> list[float]:
    """Scores that agree with the merged order: an entry placed above better-scored ones (an
    exact match, a sub-query's best) takes the best score below it, so a stable re-sort
    (graph re-ranking) keeps the order unless something changes a score."""
    out = list(scores)
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return out
