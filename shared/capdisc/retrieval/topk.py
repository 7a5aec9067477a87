"""Choosing rows: the exact top-k of a score row among the allowed rows (:func:`top_rows`), and
the candidate rows sub-queries are scored on (:func:`candidate_pool`), without sorting a large
catalog.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from capdisc.retrieval.lexical import IntArray, Scores

#: Which rows a search may return (filters and visibility applied), one flag per row.
BoolArray = npt.NDArray[np.bool_]

_SAMPLE = 512


def top_rows(scores: Scores, allowed: BoolArray, k: int) -> list[int]:
    """Rows of the ``k`` best allowed scores, best first (ties keep catalog order).

    Exact, and fast on large catalogs: a strided sample gives a threshold that at least ``k``
    scores pass, so only those are sorted; many equal scores (BM25's zeros) are skipped."""
    if k <= 0 or scores.size == 0:
        return []
    candidates = _above_threshold(scores, allowed, k)
    values = scores[candidates]
    if candidates.size > k:
        kth = np.partition(values, values.size - k)[values.size - k]
        above = np.flatnonzero(values > kth)
        keep = np.concatenate([above, np.flatnonzero(values == kth)[: k - above.size]])
        candidates, values = candidates[keep], values[keep]
    order = np.lexsort((candidates, -values))
    return [int(r) for r in candidates[order]]


def candidate_pool(
    ranking: list[int], matching: list[IntArray], allowed: BoolArray, size: int
) -> IntArray:
    """Allowed rows worth scoring sub-queries on, sorted: the first ``size`` of ``ranking``
    (the whole query's best) and each sub-query's best matching rows (``matching``)."""
    picked = np.concatenate([np.asarray(ranking[:size], dtype=np.int64), *matching])
    picked = np.unique(picked)
    pool: IntArray = picked[allowed[picked]]
    return pool


def best_matching(scores: Scores, allowed: BoolArray, k: int) -> IntArray:
    """Rows of the ``k`` best positive scores among the allowed (fewer when fewer match; in no
    particular order): BM25 scores are zero for most rows, so only the matching ones are sorted.
    On a large catalog a strided sample first gives a threshold most rows fall under, so only
    the rows above it are looked at (every matching row when fewer than ``k`` allowed ones pass
    it)."""
    if k > 0 and _worth_sampling(scores.size, k):
        rows = _above_sample(scores, allowed, k)
        if rows is not None:
            return rows[np.argpartition(-scores[rows], k - 1)[:k]] if rows.size > k else rows
    rows = np.flatnonzero((scores > 0) & allowed)
    if rows.size <= k:
        return rows
    values = scores[rows]
    if k > 0 and _worth_sampling(rows.size, k):
        keep = _at_least_kth(values, k)
        rows, values = rows[keep], values[keep]
    picked: IntArray = rows[np.argpartition(-values, k - 1)[:k]] if rows.size > k else rows
    return picked


def _above_sample(scores: Scores, allowed: BoolArray, k: int) -> IntArray | None:
    """The allowed rows with a positive score at or above a threshold that a strided sample of
    every row puts at about its ``2k``-th largest, when at least ``k`` of them are (then they
    hold the ``k`` best allowed positive scores); else None."""
    threshold = max(_sampled_threshold(scores, k), 0.0)
    rows: IntArray = np.flatnonzero(scores > threshold if threshold == 0.0 else scores >= threshold)
    rows = rows[allowed[rows]]
    return rows if rows.size >= k else None


def _at_least_kth(values: Scores, k: int) -> IntArray:
    """Positions of ``values`` that surely hold its ``k`` largest: those at or above a
    threshold a strided sample puts below the ``k``-th largest (every position when it does
    not), so the many matches of a common word are not all partitioned."""
    threshold = _sampled_threshold(values, k)
    keep: IntArray = np.flatnonzero(values >= threshold)
    return keep if keep.size >= k else np.arange(values.size)


def _above_threshold(scores: Scores, allowed: BoolArray, k: int) -> IntArray:
    """Allowed rows among which the ``k`` best surely are: those above a threshold taken from
    a strided sample, plus the first rows tied with it when too few are above (BM25's zeros);
    every allowed row when in doubt."""
    everyone = bool(allowed.all())
    n = scores.size
    rows: IntArray = np.arange(n) if everyone else np.flatnonzero(allowed)
    if not _worth_sampling(n, k):
        return rows
    threshold = _sampled_threshold(scores, k)
    above = scores > threshold if everyone else (scores > threshold) & allowed
    count = int(np.count_nonzero(above))
    if count > n // 4:
        return rows
    if count >= k:
        return np.flatnonzero(above)
    tied = scores == threshold if everyone else (scores == threshold) & allowed
    ties = np.flatnonzero(tied)[: k - count]
    if count + ties.size < k:
        return rows
    return np.concatenate([np.flatnonzero(above), ties])


def _worth_sampling(n: int, k: int) -> bool:
    """Whether ``n`` scores are enough, against ``k`` wanted, for a sampled threshold to pay."""
    return n > 8 * _SAMPLE and k * 8 < n


def _sampled_threshold(values: Scores, k: int) -> float:
    """About the ``2k``-th largest of ``values``, read off a strided sample of :data:`_SAMPLE`
    of them (callers check that enough values pass it, and fall back when not)."""
    sample = values[:: values.size // _SAMPLE]
    need = min(sample.size, 2 * (k * sample.size) // values.size + 2)
    return float(np.partition(sample, sample.size - need)[sample.size - need])
