"""Score normalisation and fusion: dense cosines and BM25 scores made comparable and mixed.

The default is the z-score convex mix: each side z-normalized over the catalog, ``dense_weight``
on the dense side. Chosen by measurement against RRF and max/min-max normalized fusion
(``docs/benchmarks.md``); RRF and either side alone stay available (:func:`fuse`). The index
scores a query without a full pass over every row where it can, so the mix also comes with the
catalog moments given (:func:`mix_side`, :func:`fuse_pooled`); both equal the full pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from capdisc.retrieval.config import RetrievalConfig
from capdisc.retrieval.lexical import IntArray, Scores

#: Per query text, a catalog-wide moment of its scores (double precision).
Moments = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LexicalSide:
    """How a query's BM25 scores enter its fused scores: ``(bm25 - mean) * scale`` (the
    lexical weight over the catalog's deviation, so the result is in fused units)."""

    bm25: Scores  # every catalog row's BM25 score for the query
    mean: float
    scale: float

    @classmethod
    def of(
        cls, bm25: Scores, mean: float, deviation: float, config: RetrievalConfig
    ) -> LexicalSide:
        """The side of scores ``bm25`` whose catalog moments are ``mean`` and ``deviation``."""
        return cls(bm25, mean, (1.0 - config.dense_weight) / deviation)  # 0 for a flat row

    def contribution(self, rows: IntArray | None = None) -> Scores:
        """The lexical part of ``rows``' fused scores (every row's without ``rows``)."""
        scores = self.bm25 if rows is None else self.bm25[rows]
        part: Scores = ((scores - self.mean) * self.scale).astype(np.float32)
        return part


@dataclass(frozen=True)
class LexicalScores:
    """The BM25 side of several query texts (a query, then its parts): each one's term ids,
    its scores of every catalog row (one row of ``bm25`` each) and their catalog moments
    (:func:`lexical_moments`)."""

    term_ids: list[IntArray]
    bm25: npt.NDArray[np.float32]
    moments: tuple[Moments, Moments]

    def text(self, i: int) -> LexicalScores:
        """Text ``i``'s side alone."""
        return self._rows(slice(i, i + 1))

    def parts(self) -> LexicalScores:
        """Every text's side but the first (the query's)."""
        return self._rows(slice(1, None))

    def side(self, i: int, config: RetrievalConfig) -> LexicalSide:
        """How text ``i``'s scores enter its fused scores."""
        mean, deviation = self.moments
        return LexicalSide.of(self.bm25[i], float(mean[i]), float(deviation[i]), config)

    def _rows(self, rows: slice) -> LexicalScores:
        mean, deviation = self.moments
        return LexicalScores(self.term_ids[rows], self.bm25[rows], (mean[rows], deviation[rows]))


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
    pool: IntArray,
    config: RetrievalConfig,
    lexical: tuple[Moments, Moments] | None = None,
) -> Scores:
    """The mix of several query texts (one row each) at the ``pool`` rows only.

    ``cosine`` holds each text's cosines at ``pool``; ``means`` and ``variances`` are each
    text's catalog-wide cosine moments; ``bm25`` holds each text's BM25 scores of every row,
    whose moments are ``lexical`` when given (:func:`lexical_moments`). The z-scores use the
    catalog-wide moments, so they equal a full pass's."""
    dense_z = (cosine - means[:, None]) / np.sqrt(np.clip(variances, 1e-12, None))[:, None]
    mean, deviation = lexical if lexical is not None else lexical_moments(bm25)
    lexical_z = (bm25[:, pool] - mean[:, None]) / deviation[:, None]  # flat rows: 0
    return mix(dense_z.astype(np.float32), lexical_z.astype(np.float32), config)


def lexical_moments(bm25: Scores, sums: Moments | None = None) -> tuple[Moments, Moments]:
    """Each row of ``bm25``'s mean and deviation over the whole catalog, in double precision
    (an infinite deviation for a flat row, so its z-scores are 0). ``sums``: each row's sum,
    when known (:meth:`capdisc.retrieval.lexical.LexicalIndex.score_sums`), which saves a
    pass over the row."""
    n = max(bm25.shape[1], 1)
    mean = (sums if sums is not None else bm25.sum(axis=1, dtype=np.float64)) / n
    squares = np.fromiter((float(np.dot(row, row)) for row in bm25), np.float64, len(bm25))
    variance = squares / n - mean**2
    deviation: Moments = np.where(variance > 1e-18, np.sqrt(np.clip(variance, 1e-18, None)), np.inf)
    return mean, deviation
