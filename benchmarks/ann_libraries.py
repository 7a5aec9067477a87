"""Approximate nearest-neighbour libraries on the engine's own vectors: build time, recall@10
of the plain dense top 10, and search latency, beside the exact scan of the same run.

The benchmark catalog of ``--size`` capabilities (``_catalog.py``, hashing-embedder stand-in
vectors) in the engine's 192-dimensional projection, the Seal-Tools queries embedded the same
way; one thread. faiss (a dependency) is measured without and with a filter bitmap inside the
graph walk (half and 5% of the rows allowed), its vectors stored as float32 and as 8-bit codes,
and as the engine uses it (128 candidates, scored exactly); usearch when it is installed
(``pip install usearch``; it has no filter inside the walk from Python). hnswlib ships no wheel,
so it is not measured.

    .venv/bin/python benchmarks/ann_libraries.py [--size 100000] [--queries 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog, seal_queries, stand_in_vectors
from _common import percentile
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.index import RetrievalIndex

Search = Callable[[np.ndarray], np.ndarray]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    embedder = HashingEmbedder(384)
    caps = load_catalog(args.size)
    index = RetrievalIndex.build(caps, stand_in_vectors(caps, embedder), config=DEFAULT_CONFIG)
    matrix = index.matrix
    projection = index.projection if index.projection is not None else np.eye(matrix.shape[1])
    texts = list(dict.fromkeys(seal_queries()))[: args.queries]
    queries = (embedder.embed(texts) @ projection).astype(np.float32)
    print(f"{len(caps):,} rows x {matrix.shape[1]} dims, {len(queries)} queries, one thread")
    measure("exact scan", queries, matrix, None, lambda q: exact_best(matrix, q, None))
    for links, codes in ((16, "flat"), (32, "flat"), (32, "sq8")):
        faiss_rows(matrix, queries, links, codes)
    usearch_rows(matrix, queries)


def exact_best(matrix: np.ndarray, query: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    scores = matrix @ query
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    return np.argpartition(-scores, 10)[:10]


def measure(
    label: str,
    queries: np.ndarray,
    matrix: np.ndarray,
    allowed: np.ndarray | None,
    search: Search,
) -> None:
    """Prints the median and p99 latency of ``search`` and its recall@10 of the exact top 10."""
    took, recall = [], []
    for query in queries:
        started = time.perf_counter()
        found = search(query)
        took.append((time.perf_counter() - started) * 1000)
        truth = set(exact_best(matrix, query, allowed).tolist())
        recall.append(len(truth & set(found.tolist())) / 10)
    print(
        f"  {label:<44} recall@10 {statistics.fmean(recall):.3f}  median "
        f"{statistics.median(took):.3f} ms  p99 {percentile(took, 99):.3f} ms"
    )


def faiss_rows(matrix: np.ndarray, queries: np.ndarray, links: int, codes: str) -> None:
    """One faiss HNSW graph, its vectors stored as float32 (``flat``) or 8-bit codes (``sq8``,
    what the engine builds), searched at three ``ef``; then, as the engine searches, its 128
    candidates scored exactly from the float32 matrix."""
    started = time.perf_counter()
    if codes == "sq8":
        graph = faiss.IndexHNSWSQ(
            matrix.shape[1], faiss.ScalarQuantizer.QT_8bit, links, faiss.METRIC_INNER_PRODUCT
        )
        graph.train(matrix)
    else:
        graph = faiss.IndexHNSWFlat(matrix.shape[1], links, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = 80
    graph.add(matrix)
    took = time.perf_counter() - started
    size = faiss.serialize_index(graph).nbytes / len(matrix)
    print(f"faiss HNSW M={links}, {codes} vectors: built in {took:.1f} s, {size:.0f} bytes a row")
    rng = np.random.default_rng(0)
    for ef in (64, 128, 256):
        params = faiss.SearchParametersHNSW(efSearch=ef)
        measure(
            f"ef {ef}",
            queries,
            matrix,
            None,
            lambda q, p=params: graph.search(q[None], 10, params=p)[1][0],
        )
        for share in (0.5, 0.05):
            allowed = rng.random(len(matrix)) < share
            bits = np.packbits(allowed, bitorder="little")
            selector = faiss.IDSelectorBitmap(len(matrix), faiss.swig_ptr(bits))
            filtered = faiss.SearchParametersHNSW(sel=selector, efSearch=ef)
            measure(
                f"ef {ef}, {share:.0%} of the rows allowed",
                queries,
                matrix,
                allowed,
                lambda q, p=filtered: graph.search(q[None], 10, params=p)[1][0],
            )
    params = faiss.SearchParametersHNSW(efSearch=128)
    measure(
        "ef 128, 128 candidates scored exactly",
        queries,
        matrix,
        None,
        lambda q, p=params: rescored(matrix, q, graph.search(q[None], 128, params=p)[1][0]),
    )


def rescored(matrix: np.ndarray, query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The 10 best of ``candidates`` by their exact inner product with ``query``."""
    found = candidates[candidates >= 0]
    return found[np.argsort(-(matrix[found] @ query))[:10]]


def usearch_rows(matrix: np.ndarray, queries: np.ndarray) -> None:
    try:
        from usearch.index import Index
    except ImportError:
        print("usearch: not installed (pip install usearch), not measured")
        return
    for links in (16, 32):
        started = time.perf_counter()
        graph = Index(
            ndim=matrix.shape[1], metric="ip", dtype="f32", connectivity=links, expansion_add=80
        )
        graph.add(np.arange(len(matrix)), matrix)
        print(f"usearch connectivity {links}: built in {time.perf_counter() - started:.1f} s")
        for ef in (64, 128, 256):
            graph.expansion_search = ef
            measure(
                f"ef {ef}",
                queries,
                matrix,
                None,
                lambda q, g=graph: np.asarray(g.search(q, 10).keys),
            )


if __name__ == "__main__":
    main()
