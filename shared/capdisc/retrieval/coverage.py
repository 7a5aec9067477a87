"""The lexical side damped by how much of a request a capability's words cover.

In a large catalog BM25 is zero for most rows, so a row sharing one rare word with the query
gets a lexical z of about the square root of the catalog's size over the rows that share it:
at 10,000 rows one shared word ("show", "reminder", "playlist") outweighs the dense side, and
near-duplicate tools of other providers that share that word crowd out the tool the query
describes. A row that has most of the request's words earns its lexical z; a row that has one
of them mostly does not.

So a row's positive lexical contribution is multiplied by ``coverage ** coverage_power``:
``coverage`` is the share of the IDF weight of the query's terms the row contains
(:meth:`capdisc.retrieval.lexical.LexicalIndex.coverage`), taken over the query's best-covered
part when the query chains several requests (:func:`capdisc.retrieval.decompose.decompose`),
so a tool that serves one step of a multi-step request is not held against the other steps'
words. Rows the query shares no word with keep their (negative) lexical z, so damping only
lowers scores.

Coverage is read for the :data:`POOL` best rows by fused score only; every other row is
scored as if it covered nothing, the most the damping could take from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from capdisc.retrieval.lexical import IntArray, LexicalIndex, Scores
from capdisc.retrieval.results import Scored
from capdisc.retrieval.topk import BoolArray, top_rows

#: Rows whose coverage is read: this many best by fused score.
POOL = 16

#: The coverage of each of the given catalog rows.
CoverageOf = Callable[[IntArray], Scores]


def damped_scores(fused: Scores, lexical: Scores, coverage: Scores, power: float) -> Scores:
    """``fused`` with each positive ``lexical`` contribution multiplied by
    ``coverage ** power`` (coverage in [0, 1])."""
    kept = np.power(np.clip(coverage, 0.0, 1.0), power, dtype=np.float32)
    result: Scores = (fused - np.maximum(lexical, 0.0) * (1.0 - kept)).astype(np.float32)
    return result


def part_coverage(lexicon: LexicalIndex, term_sets: Sequence[IntArray]) -> CoverageOf:
    """Coverage of a row: the best over ``term_sets`` (the whole query's terms, then each
    part's) of the share of that set's IDF weight the row contains. Each row's is read once:
    a search that damps its scores again after adding candidates asks for the same best rows
    a second time."""
    known: dict[int, float] = {}

    def coverage_of(rows: IntArray) -> Scores:
        missing = np.asarray([row for row in rows.tolist() if row not in known], dtype=np.int64)
        if missing.size:
            best = lexicon.coverage_many(term_sets, missing).max(axis=0, initial=0.0)
            known.update(zip(missing.tolist(), best.tolist(), strict=True))
        return np.asarray([known[row] for row in rows.tolist()], dtype=np.float32)

    return coverage_of


def damp_uncovered(
    scored: Scored,
    allowed: BoolArray,
    coverage_of: CoverageOf,
    power: float,
    pool: int = POOL,
) -> Scored:
    """``scored`` with its lexical contributions damped by coverage: exactly for the ``pool``
    best allowed rows by fused score; every other row as if it covered nothing (its positive
    lexical part dropped), which is what it would at most lose."""
    side = scored.lexical
    if side is None or power <= 0.0:
        return scored
    lexical = side.contribution(scored.rows)  # at each position of ``scored``
    fused: Scores = scored.fused - np.maximum(lexical, 0.0)
    admitted = allowed if scored.rows is None else allowed[scored.rows]
    best = np.asarray(top_rows(scored.fused, admitted, pool), dtype=np.int64)
    rows = best if scored.rows is None else scored.rows[best]
    fused[best] = damped_scores(scored.fused[best], lexical[best], coverage_of(rows), power)
    return replace(scored, fused=fused)
