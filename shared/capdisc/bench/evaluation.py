"""Retrieval benchmarks: labelled queries, the metrics, and the runner.

Catalogs are read by :mod:`capdisc.registry.catalogs` (``tools.jsonl``, each line on its own: a
line that is no valid tool is refused and listed, the rest is scored). ``queries.jsonl`` holds
``id``, ``query`` and ``relevant`` (the dataset ids or unique names of the tools that answer
it; an empty list: nothing in the catalog fits). A query whose relevant tools were all refused
is left out of the scores and counted.

Catalog and query embeddings are cached on disk (``benchmarks/.cache/`` of the checkout, or
``CAPDISC_BENCH_CACHE``) under the embedder id and a hash of the texts, so reruns are fast.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from capdisc.bench.vectorcache import TextVectorCache, embed_through
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import Query, embed_turn, rank
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.port import CachedQueryEmbedder, Embedder, Matrix
from capdisc.errors import ManifestError
from capdisc.filters import SearchFilters
from capdisc.models import Capability
from capdisc.registry.catalogs import Catalog, load_catalog, read_jsonl
from capdisc.retrieval.config import DEFAULT_CONFIG, RetrievalConfig
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.entities import annotate
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.probes import PROBES
from capdisc.retrieval.relevance import relevance
from capdisc.retrieval.results import RetrievalResult
from capdisc.retrieval.text import FULL_TEXT_WEIGHT, combine, full_text, summary_text

RECALL_AT = (1, 3, 5, 10)
Collection_ = Sequence[str] | set[str] | frozenset[str]
T = TypeVar("T")
#: The engine's configuration when none is given: the defaults every worker serves.
ENGINE_DEFAULTS = DiscoveryConfig()
#: Queries whose whole turn, the model included, is timed for ``latency_with_embedding_ms``.
FRESH_QUERIES = 100


# -- queries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelledQuery:
    id: str
    query: str
    relevant: tuple[str, ...]  # capability ids; empty: nothing in the catalog fits
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QuerySet:
    """The queries to score, and the ids of those left out because every tool they name was
    refused by the catalog reader."""

    queries: list[LabelledQuery]
    dropped: tuple[str, ...] = ()


def read_queries(path: Path, catalog: Catalog) -> QuerySet:
    """Read a ``queries.jsonl`` file, mapping labels to capability ids. Unknown labels are
    dropped; a query whose labels are all unknown is dropped (not turned into a no-tool query),
    and counted in :attr:`QuerySet.dropped` when some of them name refused tools."""
    queries: list[LabelledQuery] = []
    dropped: list[str] = []
    for where, record in read_jsonl(path):
        query_id, text, labels = _query_fields(record, where)
        relevant = tuple(dict.fromkeys(catalog.ids[r] for r in labels if r in catalog.ids))
        if labels and not relevant:
            if catalog.refused_labels.intersection(labels):
                dropped.append(query_id)
            continue
        meta = {k: v for k, v in record.items() if k not in ("id", "query", "relevant")}
        queries.append(LabelledQuery(query_id, text, relevant, meta))
    return QuerySet(queries, tuple(dropped))


def query_texts(path: Path) -> list[str]:
    """The question of each line of a ``queries.jsonl`` file (its labels not needed: a turn to
    measure), each line checked as :func:`read_queries` checks it."""
    return [_query_fields(record, where)[1] for where, record in read_jsonl(path)]


def _query_fields(record: Mapping[str, Any], where: str) -> tuple[str, str, list[str]]:
    """A labelled query line's id (its place in the file when it has none), text and relevant
    tool labels; :class:`ManifestError` naming the line and field when one is unusable."""
    text = record.get("query")
    if not isinstance(text, str) or not text.strip():
        raise ManifestError(where, "query", "must be a non-empty string: the question asked")
    labels = record.get("relevant")
    if labels is None:
        labels = []
    if not isinstance(labels, list) or not all(isinstance(r, str | int) for r in labels):
        raise ManifestError(
            where, "relevant", "must be a list of tool ids (an empty list: nothing fits)"
        )
    query_id = record.get("id")
    return str(query_id) if query_id is not None else where, text, [str(r) for r in labels]


def load_queries(path: Path, catalog: Catalog) -> list[LabelledQuery]:
    """The queries of :func:`read_queries` to score."""
    return read_queries(path, catalog).queries


def sample_queries(queries: Sequence[T], sample: int | None, seed: int) -> list[T]:
    """A fixed random sample (``random.Random(seed).sample``), or all queries."""
    if sample is None or sample >= len(queries):
        return list(queries)
    return random.Random(seed).sample(list(queries), sample)


# -- embeddings with a disk cache ------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``CAPDISC_BENCH_CACHE``, else ``benchmarks/.cache`` of this checkout."""
    env = os.environ.get("CAPDISC_BENCH_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "benchmarks" / ".cache"


def embed_cached(
    embedder: Embedder, texts: Sequence[str], cache_dir: Path | None, batch: int = 32
) -> Matrix:
    """Embed ``texts``, each cached on disk by its own hash (:mod:`capdisc.bench.vectorcache`):
    a catalog that changes in one tool embeds that tool's texts again, nothing else."""
    if cache_dir is None:
        return embed_through(None, embedder, texts, batch)
    cache = TextVectorCache(cache_dir, embedder)
    try:
        return embed_through(cache, embedder, texts, batch)
    finally:
        cache.close()


def build_snapshot(
    capabilities: Sequence[Capability],
    embedder: Embedder,
    *,
    cache_dir: Path | None = None,
    full_weight: float = FULL_TEXT_WEIGHT,
) -> IndexSnapshot:
    """Index ``capabilities`` the way a discovery worker does: each stored vector is
    :func:`capdisc.retrieval.text.combine` of the two texts' embeddings (cached on disk), then
    :meth:`IndexSnapshot.build` with the embedder's calibration and probe vectors.
    ``full_weight`` 1.0 stores the full text's embedding alone: one text embedded per
    capability instead of two."""
    vectors = embed_cached(embedder, [full_text(c) for c in capabilities], cache_dir)
    summaries = (
        embed_cached(embedder, [summary_text(c) for c in capabilities], cache_dir)
        if full_weight < 1.0
        else vectors
    )
    entries = [
        (cap, combine(full, summary, full_weight).tobytes())
        for cap, full, summary in zip(capabilities, vectors, summaries, strict=True)
    ]
    probes = embed_cached(embedder, list(PROBES), cache_dir)
    return IndexSnapshot.build("benchmark", 1, embedder.dim, entries, embedder.id, probes=probes)


@dataclass(frozen=True)
class QueryVectors:
    """Pre-computed vectors of queries and their sub-queries (so timings exclude the model)."""

    vectors: Mapping[str, np.ndarray]

    def __call__(self, texts: list[str]) -> Matrix:
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)

    def of(self, query: str, entity_types: bool) -> np.ndarray:
        """``query``'s vector as the engine embeds a turn: with its entities' kinds written
        beside them when ``entity_types`` is on (:func:`annotate`), else as asked."""
        return self.vectors[annotate(query) if entity_types else query]

    @classmethod
    def embed(
        cls,
        embedder: Embedder,
        queries: Iterable[str],
        cache_dir: Path | None,
        config: RetrievalConfig = DEFAULT_CONFIG,
    ) -> QueryVectors:
        texts: dict[str, None] = {}
        for query in queries:  # as asked, and as a turn embeds it (see :meth:`of`)
            for text in dict.fromkeys((query, annotate(query))):
                texts.setdefault(text)
                for part in decompose(text, config.max_subqueries, implied=True):
                    texts.setdefault(part)
        ordered = list(texts)
        return cls(dict(zip(ordered, embed_cached(embedder, ordered, cache_dir), strict=True)))


# -- metrics ---------------------------------------------------------------------------------------


def recall_at(ranked: Sequence[str], relevant: Collection_, k: int) -> float:
    return len(set(ranked[:k]) & set(relevant)) / len(relevant)


def ndcg_at(ranked: Sequence[str], relevant: Collection_, k: int = 5) -> float:
    """Binary-gain NDCG: ideal DCG puts ``min(len(relevant), k)`` hits first."""
    rel = set(relevant)
    dcg = sum(1.0 / math.log2(i + 2) for i, cid in enumerate(ranked[:k]) if cid in rel)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(rel), k)))
    return dcg / ideal


def reciprocal_rank(ranked: Sequence[str], relevant: Collection_) -> float:
    rel = set(relevant)
    return next((1.0 / (i + 1) for i, cid in enumerate(ranked) if cid in rel), 0.0)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ranking_metrics(
    rankings: Sequence[Sequence[str]], relevant: Sequence[Collection_]
) -> dict[str, float]:
    """recall@1/3/5/10, ndcg@5, complete@5, hit@5 and mrr averaged over answerable queries."""
    pairs = [(r, rel) for r, rel in zip(rankings, relevant, strict=True) if rel]
    out: dict[str, float] = {}
    if not pairs:
        return out
    n = len(pairs)
    for k in RECALL_AT:
        out[f"recall@{k}"] = sum(recall_at(r, rel, k) for r, rel in pairs) / n
    out["ndcg@5"] = sum(ndcg_at(r, rel) for r, rel in pairs) / n
    out["complete@5"] = sum(set(rel) <= set(r[:5]) for r, rel in pairs) / n
    out["hit@5"] = sum(bool(set(rel) & set(r[:5])) for r, rel in pairs) / n
    out["mrr"] = sum(reciprocal_rank(r, rel) for r, rel in pairs) / n
    return out


def abstention_metrics(
    abstained: Sequence[bool], relevant: Sequence[Collection_]
) -> dict[str, float]:
    """``abstain_accuracy`` over no-tool queries and ``answer_rate`` over answerable ones."""
    empty = [a for a, rel in zip(abstained, relevant, strict=True) if not rel]
    answerable = [a for a, rel in zip(abstained, relevant, strict=True) if rel]
    out: dict[str, float] = {}
    if empty:
        out["abstain_accuracy"] = sum(empty) / len(empty)
        out["answer_rate"] = (
            sum(not a for a in answerable) / len(answerable) if answerable else float("nan")
        )
    return out


# -- the runner ------------------------------------------------------------------------------------


class Ranked(Protocol):
    """One query's answer, from the engine or from the retrieval index alone."""

    @property
    def ids(self) -> tuple[str, ...]: ...

    @property
    def abstained(self) -> bool: ...


@dataclass(frozen=True)
class BenchmarkRun:
    """Everything one run produced, for the figures and for calibration."""

    queries: list[LabelledQuery]
    results: Sequence[Ranked]
    latencies_s: list[float]
    tools: int


Exclude = Callable[[LabelledQuery], Sequence[str]]


def run_queries(
    snapshot: IndexSnapshot,
    queries: Sequence[LabelledQuery],
    vectors: QueryVectors,
    *,
    k: int = 10,
    config: DiscoveryConfig = ENGINE_DEFAULTS,
    exclude: Exclude | None = None,
) -> BenchmarkRun:
    """Rank every query with the engine (:func:`capdisc.discovery.engine.rank`: retrieval, minimum
    relevance, graph re-ranking, abstention), timed, query embeddings cached."""

    def search(query: LabelledQuery, excluded: Sequence[str]) -> Ranked:
        filters = SearchFilters(exclude_ids=frozenset(excluded))
        return rank(
            snapshot,
            Query(query.query, k, filters),
            vectors.of(query.query, config.entity_types),
            config,
            k,
            vectors,
        )

    return _timed(queries, search, exclude, len(snapshot))


def run_retrieval(
    index: RetrievalIndex,
    queries: Sequence[LabelledQuery],
    vectors: QueryVectors,
    *,
    k: int = 10,
    config: RetrievalConfig = DEFAULT_CONFIG,
    exclude: Exclude | None = None,
) -> BenchmarkRun:
    """Search every query with the retrieval index alone (for calibration: its results carry
    the evidence the relevance model is fitted on)."""

    def search(query: LabelledQuery, excluded: Sequence[str]) -> Ranked:
        return index.search(
            query.query,
            vectors.of(query.query, config.entity_types),
            k,
            filters=SearchFilters(exclude_ids=frozenset(excluded)),
            embed=vectors,
            config=config,
        )

    return _timed(queries, search, exclude, len(index))


def _timed(
    queries: Sequence[LabelledQuery],
    search: Callable[[LabelledQuery, Sequence[str]], Ranked],
    exclude: Exclude | None,
    tools: int,
) -> BenchmarkRun:
    """Run ``search`` on every query (with its excluded ids), timing each call."""
    results, latencies = [], []
    for query in queries:
        excluded = exclude(query) if exclude is not None else ()
        start = time.perf_counter()
        results.append(search(query, excluded))
        latencies.append(time.perf_counter() - start)
    return BenchmarkRun(list(queries), results, latencies, tools)


def summarize(run: BenchmarkRun) -> dict[str, Any]:
    """The JSON figures of one retrieval run (what ``capdisc bench retrieval --json`` prints)."""
    relevant = [q.relevant for q in run.queries]
    out: dict[str, Any] = dict(ranking_metrics([r.ids for r in run.results], relevant))
    for key in [f"recall@{k}" for k in RECALL_AT] + ["ndcg@5", "complete@5", "hit@5", "mrr"]:
        out[key] = round(out.get(key, float("nan")), 4)
    out["queries"] = len(run.queries)
    out["tools"] = run.tools
    ms = [s * 1000 for s in run.latencies_s]
    out["latency_ms"] = {
        "p50": round(statistics.median(ms), 3) if ms else float("nan"),
        "p99": round(percentile(ms, 99), 3),
    }
    for key, value in abstention_metrics([r.abstained for r in run.results], relevant).items():
        out[key] = round(value, 4)
    answerable = [r.abstained for r, rel in zip(run.results, relevant, strict=True) if rel]
    if answerable:
        out["abstained_answerable"] = round(sum(answerable) / len(answerable), 4)
    return out


def latency_with_embedding(
    snapshot: IndexSnapshot,
    queries: Sequence[LabelledQuery],
    embedder: Embedder,
    config: DiscoveryConfig,
    k: int = 10,
) -> dict[str, float]:
    """Median and p99 of whole turns, the query embedded by the model each time (no cache),
    over at most :data:`FRESH_QUERIES` queries: what a turn costs when its text is new."""
    fresh = CachedQueryEmbedder(embedder, 0)
    ms = []
    for query in queries[:FRESH_QUERIES]:
        start = time.perf_counter()
        vector, embed = embed_turn(fresh, query.query, config)
        rank(snapshot, Query(query.query, k), vector, config, k, embed)
        ms.append((time.perf_counter() - start) * 1000)
    return {
        "p50": round(statistics.median(ms), 3),
        "p99": round(percentile(ms, 99), 3),
        "n": len(ms),
    }


def run_retrieval_benchmark(
    tools_path: Path,
    queries_path: Path,
    *,
    sample: int | None = None,
    seed: int = 0,
    embedder: Embedder,
    config: DiscoveryConfig = ENGINE_DEFAULTS,
    cache_dir: Path | None = None,
    abstain: bool = True,
) -> dict[str, Any]:
    """Index the catalog, run the (sampled) queries and return the figures as one JSON object:
    ``recall@1/3/5/10``, ``ndcg@5``, ``complete@5``, ``hit@5``, ``mrr``, ``queries``, ``tools``,
    ``latency_ms`` (``p50``, ``p99``: query vectors precomputed) and
    ``latency_with_embedding_ms`` (the model embedding each query, :func:`latency_with_embedding`),
    ``abstained_answerable`` (the share of answerable queries given no answer); when some
    queries have no relevant tool, ``abstain_accuracy`` and ``answer_rate``; and what
    :func:`catalog_figures` reports of the catalog's refused lines and repairs, when there are
    any. ``abstain`` False ranks without abstaining (``abstain_threshold`` 0), so ranking and
    abstention are reported apart."""
    if not abstain:
        config = config.merged({"abstain_threshold": 0.0})
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    catalog = load_catalog(tools_path)
    if not catalog.capabilities:
        refused = catalog.refused
        first = f" (line {refused[0].line}: {refused[0].reason})" if refused else ""
        raise ManifestError(
            str(tools_path), None, f"holds no valid tool; {len(refused)} lines refused{first}"
        )
    labelled = read_queries(queries_path, catalog)
    queries = sample_queries(labelled.queries, sample, seed)
    snapshot = build_snapshot(catalog.capabilities, embedder, cache_dir=cache)
    vectors = QueryVectors.embed(embedder, (q.query for q in queries), cache)
    figures = summarize(run_queries(snapshot, queries, vectors, config=config))
    figures["latency_with_embedding_ms"] = latency_with_embedding(
        snapshot, queries, embedder, config
    )
    figures["abstain"] = abstain
    return figures | catalog_figures(catalog, labelled)


def catalog_figures(catalog: Catalog, queries: QuerySet) -> dict[str, Any]:
    """What the benchmark left out or repaired, each key only when there is something to say:
    ``refused`` (``[{"line", "reason"}]``: catalog lines that are no valid tool), ``notes``
    (``[{"line", "note"}]``: repairs made to lines that were read) and ``dropped_queries``
    (labelled queries whose relevant tools were all refused)."""
    out: dict[str, Any] = {}
    if catalog.refused:
        out["refused"] = [{"line": r.line, "reason": r.reason} for r in catalog.refused]
    if catalog.notes:
        out["notes"] = [{"line": n.line, "note": n.text} for n in catalog.notes]
    if queries.dropped:
        out["dropped_queries"] = len(queries.dropped)
    return out


def holdout_abstention(
    snapshot: IndexSnapshot,
    queries: Sequence[LabelledQuery],
    vectors: QueryVectors,
    config: DiscoveryConfig = ENGINE_DEFAULTS,
) -> dict[str, float]:
    """ "Nothing fits" made from answerable queries: each is asked again with its relevant
    capabilities removed from the catalog. Returns ``abstain_accuracy`` (share of those that
    abstain) and ``answer_rate`` (share of the original queries answered)."""
    answerable = [q for q in queries if q.relevant]
    asked = run_queries(snapshot, answerable, vectors, config=config)
    removed = run_queries(
        snapshot, answerable, vectors, config=config, exclude=lambda q: q.relevant
    )
    flags = [r.abstained for r in asked.results] + [r.abstained for r in removed.results]
    labels: list[tuple[str, ...]] = [q.relevant for q in answerable] + [() for _ in answerable]
    return abstention_metrics(flags, labels)


# -- calibration -----------------------------------------------------------------------------------


def best_evidence(run: BenchmarkRun) -> np.ndarray:
    """Per query, the strongest evidence among its entries: (max cosine, max coverage, max z).
    ``run`` comes from :func:`run_retrieval`."""
    rows = []
    for result in run.results:
        assert isinstance(result, RetrievalResult), "calibrate on run_retrieval results"
        evidence = [e.evidence for e in result.entries] or [(0.0, 0.0, 0.0)]
        rows.append(tuple(max(e[i] for e in evidence) for i in range(3)))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 3)


def fit_logistic(
    features: np.ndarray, labels: np.ndarray, *, l2: float = 1e-3, iterations: int = 50
) -> tuple[float, tuple[float, ...]]:
    """Logistic regression by Newton's method: ``(bias, weights)``."""
    x = np.hstack([np.ones((features.shape[0], 1)), features])
    w = np.zeros(x.shape[1])
    penalty = l2 * np.eye(x.shape[1])
    penalty[0, 0] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -60, 60)))
        gradient = x.T @ (p - labels) + penalty @ w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + penalty
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return float(w[0]), tuple(float(v) for v in w[1:])


#: Share of each tuning split's answerable queries the abstention floor keeps answered: the
#: target is 95%; the margin covers the sample-to-sample spread measured between the
#: MetaTool tuning queries and the evaluation sample (0.963 against 0.969).
FLOOR_ANSWER_RATE = 0.965


def calibrated(
    config: RetrievalConfig,
    answered: Sequence[BenchmarkRun],
    removed: Sequence[BenchmarkRun],
    *,
    answer_rate: float = FLOOR_ANSWER_RATE,
) -> RetrievalConfig:
    """``config`` with the relevance model and the abstention floor fitted on tuning splits.

    ``answered``: per split, answerable queries searched with the full catalog (from
    :func:`run_retrieval` with ``collect_evidence``); ``removed``: the same queries with their
    relevant capabilities excluded ("nothing fits"). The relevance is a logistic model of the
    best dense cosine, fitted on all splits together (BM25 coverage and the fused z were
    measured and left out: they made real no-tool queries look answerable); the floor is the
    highest threshold that keeps ``answer_rate`` of *every* split's answerable queries
    answered. The per-catalog raise from probe queries comes on top, at query time.
    """
    positives = np.vstack([best_evidence(run) for run in answered])
    negatives = np.vstack([best_evidence(run) for run in removed])
    features = np.vstack([positives, negatives])[:, :1]
    labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    bias, (w_cos,) = fit_logistic(features, labels)
    fitted = replace(
        config, relevance_bias=bias, relevance_cosine=w_cos, relevance_coverage=0.0, relevance_z=0.0
    )
    floors = [answer_floor(fitted, run, answer_rate) for run in answered]
    return replace(fitted, abstain_threshold=round(min(floors, default=0.0), 4))


def answer_floor(config: RetrievalConfig, answered: BenchmarkRun, answer_rate: float) -> float:
    """The highest relevance threshold that keeps ``answer_rate`` of ``answered`` answered."""
    tops = sorted(relevance((float(c), 0.0, 0.0), config) for c in best_evidence(answered)[:, 0])
    return float(tops[int((1.0 - answer_rate) * len(tops))]) if tops else 0.0
