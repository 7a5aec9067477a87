"""Calibrated relevance and abstention.

Each ranked entry gets a relevance in [0, 1]: a logistic model of its evidence (mainly its dense
cosine with the query text it scored best on), fitted on held-out data
(:func:`capdisc.bench.evaluation.calibrated`) with "nothing fits" queries made by removing each
query's relevant tools. A search abstains when no entry reaches the threshold
(:func:`abstain_threshold`): the configured floor, raised per catalog to how close the catalog
comes to probe queries that need no capability (:mod:`capdisc.retrieval.probes`).
"""

from __future__ import annotations

import math

import numpy as np

from capdisc.embedders.port import Matrix
from capdisc.retrieval.config import RetrievalConfig


def relevance(evidence: tuple[float, float, float], config: RetrievalConfig) -> float:
    """The calibrated relevance of (cosine, coverage, fused z): a logistic model."""
    cosine, coverage, fused = evidence
    logit = (
        config.relevance_bias
        + config.relevance_cosine * cosine
        + config.relevance_coverage * coverage
        + config.relevance_z * fused
    )
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, logit))))


def abstain_threshold(probe_cosines: tuple[float, ...], config: RetrievalConfig) -> float:
    """The relevance an answer needs: the configured floor, raised to how close the catalog
    comes to the probe queries (``probe_cosines``, sorted; 0 never abstains)."""
    floor = config.abstain_threshold
    if floor <= 0 or not config.adaptive_abstain or not probe_cosines:
        return floor
    cosine = _quantile(probe_cosines, config.probe_quantile)
    return max(floor, relevance((cosine, 0.0, 0.0), config))


def probe_cosines(
    matrix: Matrix, probe_vectors: Matrix | None, projection: Matrix | None
) -> tuple[float, ...]:
    """Each probe's best cosine over the catalog, in the space queries are scored in, sorted."""
    if probe_vectors is None or len(probe_vectors) == 0 or len(matrix) == 0:
        return ()
    probes = np.asarray(probe_vectors, dtype=np.float32)
    if projection is not None:
        probes = probes @ projection
    best = (probes @ matrix.T).max(axis=1)
    return tuple(sorted(float(b) for b in best))


def _quantile(ordered: tuple[float, ...], q: float) -> float:
    """``numpy.quantile`` (linear) of already sorted values, without numpy's overhead."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
