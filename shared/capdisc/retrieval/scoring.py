"""Score normalisation and fusion: dense cosines and BM25 scores made comparable and mixed.

The default is the z-score convex mix: each side z-normalized over the catalog, ``dense_weight``
on the dense side. Chosen by measurement against RRF and max/min-max normalized fusion
(``docs/benchmarks.md``); RRF and either side alone stay available (:func:`fuse`). The index
scores a query without a full pass over every row where it can, so the mix also comes with the
catalog moments given (:func:`mix_side`, :func:`fuse_pooled`); both equal the full pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from capdisc.retrieval.config import RetrievalConfig
from capdisc.retrieval.lexical import IntArray, LexicalIndex, Scores
from capdisc.retrieval.textstats import KEPT_FACTOR, TextMemo, TextStats, scores_at
from capdisc.retrieval.topk import BoolArray, best_matching

#: Per query text, a catalog-wide moment of its scores (double precision).
Moments = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LexicalSide:
    """How a query's BM25 scores enter its fused scores: ``(bm25 - mean) * scale`` (the
    lexical weight over the catalog's deviation, so the result is in fused units)."""

    scores: LexicalScores  # the query's BM25 side alone
    mean: float
    scale: float

    @classmethod
    def of(
        cls, scores: LexicalScores, mean: float, deviation: float, config: RetrievalConfig
    ) -> LexicalSide:
        """The side of ``scores`` whose catalog moments are ``mean`` and ``deviation``."""
        return cls(scores, mean, (1.0 - config.dense_weight) / deviation)  # 0 for a flat row

    @property
    def bm25(self) -> Scores:
        """Every catalog row's BM25 score for the query."""
        return self.scores.row(0)

    def contribution(self, rows: IntArray | None = None) -> Scores:
        """The lexical part of ``rows``' fused scores (every row's without ``rows``)."""
        scores = self.bm25 if rows is None else self.scores.at(rows)[0]
        part: Scores = ((scores - self.mean) * self.scale).astype(np.float32)
        return part


@dataclass(frozen=True)
class LexicalScores:
    """The BM25 side of several query texts (a query, then its parts), searched among the
    ``allowed`` rows: each text's term ids, the catalog moments of its scores
    (:func:`lexical_moments`), and the scores themselves, either every row's (``bm25``, one
    row per text: :meth:`full`) or, on a large catalog searched on candidates only, read at
    the rows asked for, with each text's ``reach`` best matching rows
    (:meth:`remembered`)."""

    term_ids: list[IntArray]
    moments: tuple[Moments, Moments]
    allowed: BoolArray
    bm25: npt.NDArray[np.float32] | None = None
    lexicon: LexicalIndex | None = None
    best: list[IntArray] = field(default_factory=list)
    reach: int = 0
    stats: list[TextStats] = field(default_factory=list)
    #: Scores read at rows so far (:meth:`at`), by the rows' bytes: a search damps the rows
    #: it has just fused.
    _read: dict[bytes, npt.NDArray[np.float32]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def full(
        cls, lexicon: LexicalIndex, term_ids: list[IntArray], allowed: BoolArray
    ) -> LexicalScores:
        """Every row's scores of each text, scored in one pass."""
        bm25 = lexicon.scores_many(term_ids)
        moments = lexical_moments(bm25, lexicon.score_sums(term_ids))
        return cls(term_ids, moments, allowed, bm25)

    @classmethod
    def remembered(
        cls,
        memo: TextMemo,
        lexicon: LexicalIndex,
        term_ids: list[IntArray],
        allowed: BoolArray,
        reach: int,
    ) -> LexicalScores:
        """Each text's moments and ``reach`` best matching rows from its figures over the
        catalog, remembered per text (:mod:`capdisc.retrieval.textstats`); its scores of
        other rows are read at those rows."""
        kept = reach * KEPT_FACTOR
        stats = [memo.stats(lexicon, ids, kept) for ids in term_ids]
        best = [
            cls._best(s, lexicon, ids, allowed, reach)
            for s, ids in zip(stats, term_ids, strict=True)
        ]
        sums = np.array([s.total for s in stats], dtype=np.float64)
        squares = np.array([s.square_total for s in stats], dtype=np.float64)
        moments = _moments(sums, squares, lexicon.num_docs)
        return cls(term_ids, moments, allowed, None, lexicon, best, reach, stats)

    @staticmethod
    def _best(
        stats: TextStats, lexicon: LexicalIndex, ids: IntArray, allowed: BoolArray, k: int
    ) -> IntArray:
        found = stats.matching(allowed, k)
        if found is not None:
            return found.astype(np.int64)  # kept as 32-bit ids; rows are 64-bit here
        row = lexicon.scores(ids)  # too few of the kept rows allowed: score the row again
        return _ordered(row, best_matching(row, allowed, k))

    def text(self, i: int) -> LexicalScores:
        """Text ``i``'s side alone."""
        return self._rows(slice(i, i + 1))

    def parts(self) -> LexicalScores:
        """Every text's side but the first (the query's)."""
        return self._rows(slice(1, None))

    def side(self, i: int, config: RetrievalConfig) -> LexicalSide:
        """How text ``i``'s scores enter its fused scores."""
        mean, deviation = self.moments
        alone = self if len(self.term_ids) == 1 else self.text(i)  # one text: its reads shared
        return LexicalSide.of(alone, float(mean[i]), float(deviation[i]), config)

    def row(self, i: int) -> Scores:
        """Every catalog row's score of text ``i`` (scored now when only rows were kept)."""
        if self.bm25 is not None:
            row: Scores = self.bm25[i]
            return row
        assert self.lexicon is not None
        return self.lexicon.scores(self.term_ids[i])

    def at(self, rows: IntArray) -> npt.NDArray[np.float32]:
        """Each text's scores of ``rows`` (one row of the result per text)."""
        if self.bm25 is not None:
            return self.bm25[:, rows]
        assert self.lexicon is not None
        key = rows.tobytes()
        read = self._read.get(key)
        if read is None:
            read = self._read[key] = self._scores_at(self.lexicon, rows)
        return read

    def _scores_at(self, lexicon: LexicalIndex, rows: IntArray) -> npt.NDArray[np.float32]:
        """:meth:`at`, the rows every text kept among its best taken from there."""
        known = [stats.known(rows) for stats in self.stats]
        found = np.logical_and.reduce([mask for mask, _ in known]) if known else None
        if found is None or not found.any():
            return scores_at(lexicon, self.term_ids, rows)
        scores = np.stack([values for _, values in known])
        missing = np.flatnonzero(~found)
        scores[:, missing] = scores_at(lexicon, self.term_ids, rows[missing])
        return scores

    def matching(self, i: int, k: int) -> IntArray:
        """The ``k`` best allowed rows text ``i``'s words reach (fewer when fewer do)."""
        if self.bm25 is not None:
            return best_matching(self.bm25[i], self.allowed, k)
        if k > self.reach:
            raise ValueError(f"{k} best rows asked of a side that kept {self.reach}")
        return self.best[i][:k]

    def _rows(self, rows: slice) -> LexicalScores:
        mean, deviation = self.moments
        return replace(
            self,
            term_ids=self.term_ids[rows],
            moments=(mean[rows], deviation[rows]),
            bm25=self.bm25[rows] if self.bm25 is not None else None,
            best=self.best[rows],
            stats=self.stats[rows],
            _read={},
        )


def _ordered(scores: Scores, rows: IntArray) -> IntArray:
    """``rows`` best first by ``scores``."""
    ordered: IntArray = rows[np.argsort(-scores[rows], kind="stable")]
    return ordered


def fuse(cosine: Scores, bm25: Scores, config: RetrievalConfig) -> Scores:
    """One query's fused scores: z-score convex mix (default), RRF, or one side alone."""
    if config.fusion == "dense":
        return zscore(cosine)
    if config.fusion == "lexical":
        return zscore(bm25)
    if config.fusion == "minmax":
        return mix(minmax(cosine), minmax(bm25), config)
    if config.fusion == "rrf":
        return reciprocal_ranks(cosine, config.rrf_k) + reciprocal_ranks(bm25, config.rrf_k)
    return mix(zscore(cosine), zscore(bm25), config)


def zscore(scores: Scores) -> Scores:
    """``(x - mean) / std`` over the catalog; all zeros when the scores are flat."""
    if scores.size == 0:
        return scores
    std = float(scores.std())
    if std < 1e-9:
        return np.zeros_like(scores)
    result: Scores = ((scores - scores.mean()) / std).astype(np.float32)
    return result


def minmax(scores: Scores) -> Scores:
    """``(x - min) / (max - min)`` over the catalog; all zeros when the scores are flat."""
    if scores.size == 0:
        return scores
    low, high = float(scores.min()), float(scores.max())
    if high - low < 1e-12:
        return np.zeros_like(scores)
    result: Scores = ((scores - low) / (high - low)).astype(np.float32)
    return result


def reciprocal_ranks(scores: Scores, k: int = 60) -> Scores:
    """RRF contribution ``1 / (k + rank)`` of each document (rank 1 is the best)."""
    ranks = np.empty(scores.size, dtype=np.float32)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, scores.size + 1, dtype=np.float32)
    result: Scores = (1.0 / (k + ranks)).astype(np.float32)
    return result


def mix(dense_z: Scores, lexical_z: Scores, config: RetrievalConfig) -> Scores:
    """The convex mix of the two sides' z-scores, ``dense_weight`` on the dense side."""
    w = config.dense_weight
    fused: Scores = (w * dense_z + (1.0 - w) * lexical_z).astype(np.float32)
    return fused


def mix_side(
    cosine: Scores, mean: float, deviation: float, side: LexicalSide, config: RetrievalConfig
) -> Scores:
    """``mix(zscore(cosine), zscore(bm25))`` with the dense moments given and the lexical side
    known (:meth:`LexicalScores.side`): two passes."""
    w = config.dense_weight
    fused: Scores = cosine * np.float32(w / deviation)
    fused += side.bm25 * np.float32(side.scale)
    fused -= np.float32(w * mean / deviation + side.scale * side.mean)
    return fused


def fuse_pooled(
    cosine: Scores,
    means: Scores,
    variances: Scores,
    bm25: Scores,
    lexical: tuple[Moments, Moments],
    config: RetrievalConfig,
) -> Scores:
    """The mix of several query texts (one row each) at some rows only.

    ``cosine`` and ``bm25`` hold each text's cosines and BM25 scores at those rows; ``means``
    and ``variances`` are each text's catalog-wide cosine moments, ``lexical`` its BM25 ones
    (:func:`lexical_moments`). The z-scores use the catalog-wide moments, so they equal a full
    pass's."""
    dense_z = (cosine - means[:, None]) / np.sqrt(np.clip(variances, 1e-12, None))[:, None]
    mean, deviation = lexical
    lexical_z = (bm25 - mean[:, None]) / deviation[:, None]  # flat rows: 0
    return mix(dense_z.astype(np.float32), lexical_z.astype(np.float32), config)


def lexical_moments(bm25: Scores, sums: Moments | None = None) -> tuple[Moments, Moments]:
    """Each row of ``bm25``'s mean and deviation over the whole catalog, in double precision
    (an infinite deviation for a flat row, so its z-scores are 0). ``sums``: each row's sum,
    when known (:meth:`capdisc.retrieval.lexical.LexicalIndex.score_sums`), which saves a
    pass over the row."""
    sums = sums if sums is not None else bm25.sum(axis=1, dtype=np.float64)
    squares = np.fromiter((float(np.dot(row, row)) for row in bm25), np.float64, len(bm25))
    return _moments(sums, squares, bm25.shape[1])


def _moments(sums: Moments, squares: Moments, count: int) -> tuple[Moments, Moments]:
    """Means and deviations of rows of ``count`` scores from their sums and sums of squares
    (an infinite deviation for a flat row)."""
    n = max(count, 1)
    mean = sums / n
    variance = squares / n - mean**2
    deviation: Moments = np.where(variance > 1e-18, np.sqrt(np.clip(variance, 1e-18, None)), np.inf)
    return mean, deviation
