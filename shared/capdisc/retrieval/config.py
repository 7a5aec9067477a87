"""Retrieval configuration: the knobs of :class:`RetrievalConfig` and the relevance model and
abstention threshold fitted per embedder (:data:`CALIBRATIONS`, :func:`calibrated_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Fusion = Literal["zscore", "minmax", "rrf", "dense", "lexical"]


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval knobs. Defaults were fitted on the tuning splits with the MiniLM embedder."""

    fusion: Fusion = "zscore"
    #: Convex weight of the dense z-score (the lexical one gets ``1 - dense_weight``).
    dense_weight: float = 0.7
    #: Weight of the full-text vector against the summary vector, when both are given.
    full_text_weight: float = 0.5
    rrf_k: int = 60
    exact_name: bool = True
    decompose: bool = True
    #: The kind of each file name, path, URL or email address written beside it in the request
    #: (:func:`capdisc.retrieval.entities.annotate`).
    entity_types: bool = True
    max_subqueries: int = 8
    #: A sub-query reserves a slot for its best capability when that one's fused z reaches this,
    subquery_min_z: float = 6.0
    #: or this one in a request of at most ``few_parts`` parts (a task of two or three steps,
    #: where each step's best gets a slot though it stands out less; a long request's many
    #: parts would crowd out the whole request's ranking).
    few_parts_min_z: float = 3.0
    few_parts: int = 3
    #: A row's positive lexical z is multiplied by its coverage of the request (the share of
    #: the query's IDF weight it contains; of the best-covered part of a decomposed query) to
    #: this power (0: off), so one rare shared word no longer outweighs the dense side
    #: (:mod:`capdisc.retrieval.coverage`). 0.5 was chosen leaving one catalog out
    #: (docs/benchmarks.md, "Lexical matches weighed by what they cover").
    coverage_power: float = 0.5
    #: Rows a sub-query is scored on: this many best of the whole query plus as many BM25 best
    #: of the sub-query.
    candidates: int = 64
    #: Catalogs of more than ``reduce_above`` rows search a ``reduce_dims``-dimensional
    #: projection of the vectors (the top right singular vectors of the matrix): half the memory
    #: traffic of a full pass (0 disables).
    reduce_dims: int = 192
    reduce_above: int = 2000
    #: A projected catalog of at most ``rescore_below`` rows (and not above ``ann_above``)
    #: also keeps its full vectors: the ``k + 1`` rows a query asks for, and ``rescore_rows``
    #: more, best by the projected scores, are scored again with exact cosines and ranked by
    #: those, since the projection drops the directions that tell near-duplicate tools apart
    #: (docs/benchmarks.md, "Exact cosines for the best rows"; 0 disables).
    rescore_below: int = 20_000
    rescore_rows: int = 32
    #: Catalogs of more than ``ann_above`` rows take a query's dense candidates from an HNSW
    #: graph (:mod:`capdisc.retrieval.neighbors`) once it is built: its ``ann_candidates`` best
    #: rows and as many BM25 best are scored exactly, instead of every row. A filter that
    #: allows at most ``ann_exact_below`` rows scores those rows exactly instead (0 disables
    #: the graph).
    ann_above: int = 20_000
    ann_candidates: int = 128
    ann_exact_below: int = 5_000
    #: A hot reload's index serves with its predecessor's graph
    #: (:class:`capdisc.retrieval.neighbors.CarriedGraph`), the rows the graph lacks scored
    #: exactly beside it; once more than ``ann_rebuild_moved`` rows have moved (added, changed
    #: or deleted) since the graph was built, a new one is built in the background.
    ann_rebuild_moved: int = 2_000
    #: Logistic relevance model: ``sigmoid(bias + w_cos * cos + w_cov * coverage + w_z * z)``,
    #: fitted for the MiniLM embedder by :func:`capdisc.bench.evaluation.calibrated` on the tuning
    #: splits (MetaTool queries outside the evaluation sample, Seal-Tools dev): answerable
    #: queries against the same queries with their relevant tools removed. Coverage and z were
    #: measured and dropped (weight 0): they made real no-tool queries look answerable.
    relevance_bias: float = -2.082
    relevance_cosine: float = 4.684
    relevance_coverage: float = 0.0
    relevance_z: float = 0.0
    #: Abstain when no entry's relevance reaches this floor (0 never abstains): the highest
    #: that keeps 96.5% of each tuning split's answerable queries answered
    #: (:func:`capdisc.bench.evaluation.calibrated`). Embedder-specific, like the above.
    abstain_threshold: float = 0.2838
    #: Raise the threshold, per catalog, to the relevance of the ``probe_quantile`` of the
    #: probe queries' best cosines (:mod:`capdisc.retrieval.probes`), when the index has probe
    #: vectors.
    adaptive_abstain: bool = True
    probe_quantile: float = 0.6
    #: The query's own no-tool signal: its nearest probe query's cosine above
    #: ``probe_baseline`` (the mean over the tuning splits' answerable queries), times this
    #: weight, is taken off each entry's cosine before the relevance model (0: off). Off by
    #: default: at 0.25 it gained no-tool abstention at 95% answered on four catalogs but lost
    #: it on two development catalogs (docs/benchmarks.md, "Generalization").
    probe_penalty: float = 0.0
    probe_baseline: float = 0.16
    #: Compute every evidence feature (BM25 coverage too) even when the relevance model does
    #: not use it: for calibration runs.
    collect_evidence: bool = False


DEFAULT_CONFIG = RetrievalConfig()


@dataclass(frozen=True)
class Calibration:
    """An embedder's relevance model and abstention threshold (see :class:`RetrievalConfig`)."""

    bias: float
    cosine: float
    abstain_threshold: float


#: Fitted per embedder by ``benchmarks/retrieval.py --calibrate``. An embedder without an entry
#: keeps the MiniLM relevance model but never abstains and takes no probe penalty (its cosines
#: mean something else).
CALIBRATIONS: dict[str, Calibration] = {
    "minilm-l6-int8": Calibration(
        DEFAULT_CONFIG.relevance_bias,
        DEFAULT_CONFIG.relevance_cosine,
        DEFAULT_CONFIG.abstain_threshold,
    ),
}


def calibrated_for(embedder_id: str, config: RetrievalConfig = DEFAULT_CONFIG) -> RetrievalConfig:
    """``config`` with the relevance model and threshold fitted for ``embedder_id``."""
    fit = CALIBRATIONS.get(embedder_id)
    if fit is None:
        return replace(config, abstain_threshold=0.0, probe_penalty=0.0)
    return replace(
        config,
        relevance_bias=fit.bias,
        relevance_cosine=fit.cosine,
        abstain_threshold=fit.abstain_threshold,
    )
