"""Retrieval quality and speed of the discovery engine against simple baselines.

Runs, with one embedder and the same capability text on every side:

- MetaTool (3,000-query sample, seed 0) and Seal-Tools (all 2,054 queries; dev is the tuning
  split, test the rest) from ``../shared/data``, and the example registry with the labelled
  queries of ``benchmarks/registry_queries.jsonl`` (12 of them with nothing that fits);
- the engine against BM25 alone, dense alone, RRF and z-score fusion (the "simple" baselines);
- abstention: "nothing fits" queries made by removing each query's relevant tools;
- per-query latency in-process (speed at 10,000 capabilities is ``discovery_speed.py``'s).

    .venv/bin/python benchmarks/retrieval.py [--embedder minilm|hashing] [--calibrate]
                                             [--json PATH]

``--calibrate`` refits the relevance model and abstention threshold on the tuning splits
(MetaTool queries outside the evaluation sample, Seal-Tools dev) and prints the values that
``RetrievalConfig`` carries as defaults. Embeddings are cached in ``benchmarks/.cache/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from capdisc.bench.evaluation import (
    LabelledQuery,
    QueryVectors,
    build_snapshot,
    calibrated,
    default_cache_dir,
    holdout_abstention,
    load_queries,
    run_queries,
    run_retrieval,
    sample_queries,
    summarize,
)
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.factory import make_embedder
from capdisc.embedders.port import Embedder
from capdisc.registry.catalogs import Catalog, load_catalog
from capdisc.registry.manifest import scan_directory
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.index import RetrievalIndex

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REGISTRY_QUERIES = ROOT / "benchmarks" / "registry_queries.jsonl"
NO_TOOL_QUERIES = ROOT / "benchmarks" / "no_tool_queries.jsonl"

ENGINE = DiscoveryConfig()
EVIDENCE = replace(DEFAULT_CONFIG, collect_evidence=True)
#: The baselines: the same index with one fusion each, no decomposition, no entity kinds, no
#: exact-name path, no graph, no minimum relevance and no abstention.
SIMPLE = {
    "decompose_queries": False,
    "entity_types": False,
    "exact_name_match": False,
    "use_graph_reranking": False,
    "tier1_min_relevance": 0.0,
    "abstain_threshold": 0.0,
}
VARIANTS: dict[str, DiscoveryConfig] = {
    "engine": ENGINE,
    "engine + graph": ENGINE.merged({"use_graph_reranking": True}),
    "engine, no abstain": ENGINE.merged({"tier1_min_relevance": 0.0, "abstain_threshold": 0.0}),
    "BM25 alone": ENGINE.merged({"fusion": "lexical", **SIMPLE}),
    "dense alone": ENGINE.merged({"fusion": "dense", **SIMPLE}),
    "RRF (k=60)": ENGINE.merged({"fusion": "rrf", **SIMPLE}),
    "z-score fusion": ENGINE.merged(SIMPLE),
}
COLUMNS = ("recall@1", "recall@5", "recall@10", "ndcg@5", "complete@5", "hit@5", "mrr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="refit relevance and abstention on the tuning splits",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write figures here")
    args = parser.parse_args()
    embedder = make_embedder(args.embedder)
    cache = default_cache_dir()
    report: dict[str, Any] = {"embedder": embedder.id}
    if DATA.is_dir():
        report.update(shared_datasets(embedder, cache, args.calibrate))
    else:
        print(
            f"benchmark data not found at {DATA}: the shared/ folder must sit beside the "
            "repository; running the example registry only\n"
        )
    report["registry"] = registry(embedder, cache)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


# -- the shared datasets ---------------------------------------------------------------------------


def shared_datasets(embedder: Embedder, cache: Path, calibrate: bool) -> dict[str, Any]:
    meta_catalog = load_catalog(DATA / "metatool" / "tools.jsonl")
    meta_all = load_queries(DATA / "metatool" / "queries.jsonl", meta_catalog)
    meta_eval = sample_queries(meta_all, 3000, 0)
    chosen = {q.id for q in meta_eval}
    meta_tune = sample_queries([q for q in meta_all if q.id not in chosen], 3000, 1)
    seal_catalog = load_catalog(DATA / "seal-tools" / "tools.jsonl")
    seal_all = load_queries(DATA / "seal-tools" / "queries.jsonl", seal_catalog)
    seal_dev = [q for q in seal_all if q.meta.get("split") == "dev"]
    seal_test = [q for q in seal_all if q.meta.get("split") != "dev"]
    meta_index = build_snapshot(meta_catalog.capabilities, embedder, cache_dir=cache)
    seal_index = build_snapshot(seal_catalog.capabilities, embedder, cache_dir=cache)
    meta_vectors = QueryVectors.embed(embedder, (q.query for q in [*meta_eval, *meta_tune]), cache)
    seal_vectors = QueryVectors.embed(embedder, (q.query for q in seal_all), cache)
    if calibrate:
        print_calibration(
            _retrieval(meta_index),
            meta_tune,
            meta_vectors,
            _retrieval(seal_index),
            seal_dev,
            seal_vectors,
        )
    out: dict[str, Any] = {}
    sets = [
        ("MetaTool (3,000-query sample, seed 0)", meta_index, meta_eval, meta_vectors),
        ("Seal-Tools (all 2,054)", seal_index, seal_all, seal_vectors),
        ("Seal-Tools dev (tuning split)", seal_index, seal_dev, seal_vectors),
        ("Seal-Tools test in+out of domain", seal_index, seal_test, seal_vectors),
    ]
    for title, index, queries, vectors in sets:
        out[title] = compare(title, index, queries, vectors)
    no_tool = load_queries(NO_TOOL_QUERIES, meta_catalog)
    print(
        f"Abstention (engine defaults): {len(no_tool)} written no-tool queries "
        "(benchmarks/no_tool_queries.jsonl), and each answerable query asked again with its "
        "relevant tools removed"
    )
    for title, index, queries, vectors in [
        ("MetaTool tuning (3,000 outside the sample)", meta_index, meta_tune, meta_vectors),
        ("MetaTool sample", meta_index, meta_eval, meta_vectors),
        ("Seal-Tools dev", seal_index, seal_dev, seal_vectors),
        ("Seal-Tools test", seal_index, seal_test, seal_vectors),
    ]:
        out.setdefault("abstention", {})[title] = abstention(
            title, index, queries, no_tool, vectors, embedder, cache
        )
    print()
    return out


def abstention(
    title: str,
    index: IndexSnapshot,
    queries: list[LabelledQuery],
    no_tool: list[LabelledQuery],
    vectors: QueryVectors,
    embedder: Embedder,
    cache: Path,
) -> dict[str, Any]:
    """Written no-tool queries abstained and answerable answered; relevant tools removed."""
    asked = QueryVectors.embed(embedder, (q.query for q in no_tool), cache)
    both = QueryVectors({**vectors.vectors, **asked.vectors})
    written = summarize(run_queries(index, [*queries, *no_tool], both))
    removed = holdout_abstention(index, queries, vectors)
    print(
        f"  {title:<44} no-tool abstained {written['abstain_accuracy']:.3f}, answerable "
        f"answered {written['answer_rate']:.3f}; relevant removed: abstained "
        f"{removed['abstain_accuracy']:.3f}"
    )
    return {
        "written": {k: written[k] for k in ("abstain_accuracy", "answer_rate")},
        "removed": removed,
    }


def print_calibration(
    meta_index: RetrievalIndex,
    meta_tune: list[LabelledQuery],
    meta_vectors: QueryVectors,
    seal_index: RetrievalIndex,
    seal_dev: list[LabelledQuery],
    seal_vectors: QueryVectors,
) -> None:
    runs = []
    for index, queries, vectors in (
        (meta_index, meta_tune, meta_vectors),
        (seal_index, seal_dev, seal_vectors),
    ):
        answerable = [q for q in queries if q.relevant]
        runs.append(
            (
                run_retrieval(index, answerable, vectors, config=EVIDENCE),
                run_retrieval(
                    index, answerable, vectors, config=EVIDENCE, exclude=lambda q: q.relevant
                ),
            )
        )
    fitted = calibrated(DEFAULT_CONFIG, [a for a, _ in runs], [r for _, r in runs])
    print("Calibration on the tuning splits (put these in RetrievalConfig):")
    print(
        f"  relevance_bias={fitted.relevance_bias:.3f} "
        f"relevance_cosine={fitted.relevance_cosine:.3f} "
        f"abstain_threshold={fitted.abstain_threshold} (the floor; probes raise it per "
        "catalog)\n"
    )


def _retrieval(snapshot: IndexSnapshot) -> RetrievalIndex:
    index: RetrievalIndex = snapshot.retriever.index  # type: ignore[attr-defined]
    return index


def compare(
    title: str, index: IndexSnapshot, queries: list[LabelledQuery], vectors: QueryVectors
) -> dict[str, Any]:
    """Run every variant and print one table."""
    print(f"{title}: {len(queries)} queries, {len(index)} tools")
    print(f"  {'':<20}" + "".join(f"{c:>11}" for c in COLUMNS) + f"{'p50 ms':>9}{'p99 ms':>9}")
    out: dict[str, Any] = {}
    for name, config in VARIANTS.items():
        figures = summarize(run_queries(index, queries, vectors, config=config))
        out[name] = figures
        latency = figures["latency_ms"]
        print(
            f"  {name:<20}"
            + "".join(f"{figures[c]:>11.3f}" for c in COLUMNS)
            + f"{latency['p50']:>9.2f}{latency['p99']:>9.2f}"
        )
    print()
    return out


# -- the example registry --------------------------------------------------------------------------


def registry(embedder: Embedder, cache: Path) -> dict[str, Any]:
    scan = scan_directory(ROOT / "examples" / "registry")
    caps = list(scan.capabilities.values())
    catalog = Catalog(tuple(caps), {c.id: c.id for c in caps})
    queries = load_queries(REGISTRY_QUERIES, catalog)
    index = build_snapshot(caps, embedder, cache_dir=cache)
    vectors = QueryVectors.embed(embedder, (q.query for q in queries), cache)
    out = compare(
        "Example registry (benchmarks/registry_queries.jsonl)",
        index,
        [q for q in queries if q.relevant],
        vectors,
    )
    no_tool = load_queries(NO_TOOL_QUERIES, catalog)
    out["abstention"] = abstention(
        f"registry + {sum(not q.relevant for q in queries)} registry-specific no-tool",
        index,
        queries,
        no_tool,
        vectors,
        embedder,
        cache,
    )
    print()
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
