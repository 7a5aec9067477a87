"""A discovery worker's memory and cached latency at up to 1,000,000 capabilities, serving a
snapshot it maps from disk, as every large tenant is served now (a worker maps the snapshot a
child process built, or one an earlier worker wrote).

This process builds the benchmark catalog's index (stand-in vectors from the hashing embedder,
384 float32s a capability like MiniLM's: the same memory and arithmetic, relevance
meaningless; the output says so) with its HNSW graph, as the child build does, and writes it
as a snapshot. A fresh process then maps it (``load_snapshot``), and prints its resident
memory beside the same process before the load (the floor: Python and capdisc imported), and
the discovery service's cached turns over ``--queries`` Seal-Tools queries: median and p99,
with the exact scan of one query's rows as the floor measured in that run, and the same turns
once more with the index's memo of query texts' BM25 figures emptied (each text's first turn
on the index). Then one capability is changed as a hot reload changes it (a delta: the new
index is built in the heap, no longer mapped, and serves with the graph it carries over; its
memo of texts is warmed with the old index's, as a worker warms each snapshot it swaps in,
here before the turns, and how long that took is printed) and the memory and turns are
measured again, with the search mode right after the delta and the graphs built for it;
then that index is written and mapped in its place, and they are measured once more (what
mapping each written snapshot would give: the worker does not, see docs/benchmarks.md).

Last, a second fresh process maps the snapshot and has the same change applied apart, as a
discovery worker applies changes to a tenant of ``map_above`` capabilities or more: a child
process maps the snapshot, applies the change, writes the result, and exits; this process maps
that in place of the one it served. Printed: the time that took, the child's peak, and this
process's memory (before, after and at its peak) and cached turns after it. (The worker's child
reads the change from Redis; here it is made in the child, so one Redis read is left out.)

    .venv/bin/python benchmarks/mapped_scale.py [--size 1000000] [--queries 300] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog, seal_queries, stand_in_vectors
from _common import percentile
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.service import Context, answer
from capdisc.discovery.snapshot import (
    HybridRetriever,
    IndexSnapshot,
    RecentTexts,
    graph_builder,
    hybrid_retriever,
)
from capdisc.discovery.snapshotfile import load_snapshot, read_header, write_snapshot
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.retrieval.neighbors import BackgroundBuilder
from capdisc.retrieval.probes import PROBES
from capdisc.sessions.policy import SessionPolicy
from capdisc.settings import Settings
from capdisc_workers.buildapart import peak_rss_mb
from capdisc_workers.heap import release_freed_memory

TENANT = "bench"
EMBEDDER = HashingEmbedder(384)
#: Texts a new index is warmed with: a worker's default.
WARM_TEXTS: int = Settings.model_fields["warm_texts"].default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # a child: map and measure
    parser.add_argument("--apart", action="store_true", help=argparse.SUPPRESS)  # ...apart
    parser.add_argument("--change-apart", help=argparse.SUPPRESS)  # its child: one change
    args = parser.parse_args()
    if args.change_apart:
        print(json.dumps(change_apart(Path(args.change_apart))))
        return
    if args.serve:
        served = (serve_apart if args.apart else serve)(Path(args.serve), args.queries)
        print(json.dumps(served))
        return
    root = Path(tempfile.mkdtemp(prefix="capdisc-mapped-"))
    try:
        built = build(args.size, root)
        child = subprocess.run(
            [sys.executable, __file__, "--serve", built["path"], "--queries", str(args.queries)],
            stdout=subprocess.PIPE,
            check=True,
        )
        served = json.loads(child.stdout.decode().strip().splitlines()[-1])
        apart = ["--serve", built["path"], "--apart", "--queries", str(args.queries)]
        child = subprocess.run(
            [sys.executable, __file__, *apart],
            stdout=subprocess.PIPE,
            check=True,
        )
        served |= json.loads(child.stdout.decode().strip().splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {"capabilities": args.size, "vectors": "hashing-384 stand-ins", **built, **served}
    figures.pop("path")
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


def build(size: int, root: Path) -> dict[str, Any]:
    """Build the catalog's snapshot of ``size`` with its graph and write it under ``root``."""
    started = time.perf_counter()
    caps = load_catalog(size)
    matrix = stand_in_vectors(caps, EMBEDDER)
    made_s = time.perf_counter() - started
    builder = BackgroundBuilder()
    started = time.perf_counter()
    snapshot = IndexSnapshot.build(
        TENANT,
        1,
        EMBEDDER.dim,
        ((c, matrix[i].tobytes()) for i, c in enumerate(caps)),
        EMBEDDER.id,
        functools.partial(hybrid_retriever, builder=builder),
        probes=EMBEDDER.embed(list(PROBES)),
    )
    del caps, matrix
    build_s = time.perf_counter() - started
    builder.idle(7200)
    graph_s = time.perf_counter() - started - build_s
    started = time.perf_counter()
    path = write_snapshot(root, snapshot, space="s", epoch="e", changes_id="0-0", policy="flag")
    write_s = time.perf_counter() - started
    del snapshot
    gc.collect()
    return {
        "path": str(path),
        "catalog_s": round(made_s, 1),
        "build_s": round(build_s, 1),
        "graph_s": round(graph_s, 1),
        "write_s": round(write_s, 1),
        "snapshot_mb": round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1),
        "builder_peak_rss_mb": round(peak_rss_mb()),
    }


def serve(path: Path, count: int) -> dict[str, Any]:
    """In a fresh process: map the snapshot at ``path`` and time cached turns on it."""
    process = psutil.Process()
    queries = seal_queries()[:count]
    cached = CachedQueryEmbedder(EMBEDDER)
    config = DiscoveryConfig()
    floor_mb = process.memory_info().rss / 2**20
    started = time.perf_counter()
    snapshot = load_snapshot(path, read_header(path), EMBEDDER.embed(list(PROBES)))
    load_s = time.perf_counter() - started
    loaded_mb = process.memory_info().rss / 2**20
    for query in queries:  # warm: query vectors cached, pages the queries touch resident
        turn(snapshot, cached, query, config)
    samples = timed_turns(snapshot, cached, queries, config)
    mapped_mb = process.memory_info().rss / 2**20
    first = first_turns(snapshot, cached, queries, config)
    scan = exact_scan(snapshot, cached, queries)
    mode = snapshot.search_mode
    builds = graph_builder().built
    started = time.perf_counter()
    changed = one_change(snapshot)
    delta_s = time.perf_counter() - started
    delta_mode = changed.search_mode  # right after the delta, before any build could finish
    texts = snapshot.recent_texts(WARM_TEXTS)  # what a worker warms the new index with
    del snapshot
    gc.collect()
    release_freed_memory()  # as a discovery worker does after applying changes
    graph_builder().idle(7200)
    rebuilt = graph_builder().built - builds
    warm_s, warmed = warmed_with(changed, texts)
    after_delta = timed_turns(changed, cached, queries, config)
    delta_mb = process.memory_info().rss / 2**20
    remapped, remap_s = written_and_mapped(changed, path.parents[2])
    texts = changed.recent_texts(WARM_TEXTS)
    del changed
    gc.collect()
    release_freed_memory()
    warmed_with(remapped, texts)
    after_remap = timed_turns(remapped, cached, queries, config)
    return {
        "load_s": round(load_s, 2),
        "search": mode,
        "floor_rss_mb": round(floor_mb),
        "rss_loaded_mb": round(loaded_mb),
        "rss_mb": round(mapped_mb),
        "delta_s": round(delta_s, 2),
        "search_after_delta": delta_mode,
        "graphs_built_after_delta": rebuilt,
        "texts_warmed_after_delta": warmed,
        "warm_after_delta_s": round(warm_s, 2),
        "rss_after_delta_mb": round(delta_mb),
        "remap_s": round(remap_s, 2),
        "rss_after_remap_mb": round(process.memory_info().rss / 2**20),
        "discover_cached_after_remap_ms": pair(after_remap),
        "peak_rss_mb": round(peak_rss_mb()),
        "discover_cached_ms": pair(samples),
        "discover_first_turn_ms": pair(first),
        "discover_cached_after_delta_ms": pair(after_delta),
        "exact_scan_ms": pair(scan),
    }


def serve_apart(path: Path, count: int) -> dict[str, Any]:
    """In a fresh process: map the snapshot at ``path``, have a child apply one change to it
    and write the result, map that in its place, and time cached turns on it."""
    process = psutil.Process()
    queries = seal_queries()[:count]
    cached = CachedQueryEmbedder(EMBEDDER)
    config = DiscoveryConfig()
    snapshot = load_snapshot(path, read_header(path), EMBEDDER.embed(list(PROBES)))
    for query in queries:
        turn(snapshot, cached, query, config)
    mapped_mb = process.memory_info().rss / 2**20
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, __file__, "--change-apart", str(path)], stdout=subprocess.PIPE, check=True
    )
    made = json.loads(child.stdout.decode().strip().splitlines()[-1])
    written = Path(made["path"])
    changed = load_snapshot(written, read_header(written), snapshot.probes)
    apart_s = time.perf_counter() - started
    texts = snapshot.recent_texts(WARM_TEXTS)
    del snapshot
    gc.collect()
    release_freed_memory()
    warmed_with(changed, texts)
    after = timed_turns(changed, cached, queries, config)
    return {
        "apart_rss_mb": round(mapped_mb),
        "apart_s": round(apart_s, 2),
        "apart_child_s": made["took_s"],
        "apart_child_peak_rss_mb": made["peak_rss_mb"],
        "rss_after_apart_mb": round(process.memory_info().rss / 2**20),
        "peak_rss_apart_mb": round(peak_rss_mb()),
        "discover_cached_after_apart_ms": pair(after),
    }


def change_apart(path: Path) -> dict[str, Any]:
    """The child of :func:`serve_apart`: map the snapshot at ``path``, apply one change, write
    the result beside it (under ``apart/``); its path, its time and this process's peak."""
    started = time.perf_counter()
    snapshot = load_snapshot(path, read_header(path), EMBEDDER.embed(list(PROBES)))
    changed = one_change(snapshot)
    graph_builder().idle(7200)  # as the worker's child does, when the change called for one
    written = write_snapshot(
        path.parents[2] / "apart", changed, space="s", epoch="e", changes_id="0-1", policy="flag"
    )
    return {
        "path": str(written),
        "took_s": round(time.perf_counter() - started, 2),
        "peak_rss_mb": round(peak_rss_mb()),
    }


def timed_turns(
    snapshot: IndexSnapshot,
    cached: CachedQueryEmbedder,
    queries: list[str],
    config: DiscoveryConfig,
) -> list[float]:
    samples = []
    for query in queries:
        started = time.perf_counter()
        turn(snapshot, cached, query, config)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def first_turns(
    snapshot: IndexSnapshot,
    cached: CachedQueryEmbedder,
    queries: list[str],
    config: DiscoveryConfig,
) -> list[float]:
    """Cached turns whose texts' BM25 figures are not remembered yet (the memo emptied
    first): each text's first turn on this index, its query vector cached."""
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)
    retriever.index.texts.forget()
    return timed_turns(snapshot, cached, queries, config)


def warmed_with(snapshot: IndexSnapshot, texts: RecentTexts) -> tuple[float, int]:
    """``snapshot`` warmed with the query texts of the one it replaced, as a discovery worker
    does on a thread of its own once it swaps a snapshot in (here before the timed turns):
    how long it took and how many texts it computed."""
    started = time.perf_counter()
    made = snapshot.warm(texts)
    return time.perf_counter() - started, made


def one_change(snapshot: IndexSnapshot) -> IndexSnapshot:
    """``snapshot`` with one capability's description edited, as a hot reload applies it: the
    new index lives in the heap, no longer mapped."""
    edited = replace(snapshot.capabilities.row(0), description="Edited for the benchmark.")
    return snapshot.with_changes(snapshot.version + 1, [(edited, first_vector(snapshot))], [])


def first_vector(snapshot: IndexSnapshot) -> bytes:
    """Row 0's stored vector (mapped back from the reduced row when the index keeps them
    reduced, as :meth:`IndexSnapshot.vectors` does for every row)."""
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)
    index = retriever.index
    if index.projection is None:
        return np.asarray(snapshot.matrix[0], dtype=np.float32).tobytes()
    return np.asarray(index.matrix[0] @ index.projection.T, dtype=np.float32).tobytes()


def written_and_mapped(snapshot: IndexSnapshot, root: Path) -> tuple[IndexSnapshot, float]:
    """``snapshot`` written under ``root`` and mapped back in this process, and how long that
    took."""
    started = time.perf_counter()
    path = write_snapshot(root, snapshot, space="s", epoch="e", changes_id="0-1", policy="flag")
    mapped = load_snapshot(path, read_header(path), snapshot.probes)
    return mapped, time.perf_counter() - started


def turn(
    snapshot: IndexSnapshot, cached: CachedQueryEmbedder, query: str, config: DiscoveryConfig
) -> None:
    answer(
        DiscoverRequest(query, tenant=snapshot.tenant),
        Context(snapshot, cached, config, SessionPolicy()),
    )


def exact_scan(
    snapshot: IndexSnapshot, cached: CachedQueryEmbedder, queries: list[str]
) -> list[float]:
    """The floor: one product of the searched matrix with each query vector."""
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)
    index = retriever.index
    samples = []
    for query in queries:
        vector = cached.embed_one(query)
        started = time.perf_counter()
        projected = vector @ index.projection if index.projection is not None else vector
        np.argpartition(-(index.matrix @ projected), 10)[:10]
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def pair(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 2), "p99": round(percentile(values, 99), 2)}


def report(figures: dict[str, Any]) -> None:
    cached, scan = figures["discover_cached_ms"], figures["exact_scan_ms"]
    first = figures["discover_first_turn_ms"]
    delta = figures["discover_cached_after_delta_ms"]
    remap = figures["discover_cached_after_remap_ms"]
    apart = figures["discover_cached_after_apart_ms"]
    print(
        f"{figures['capabilities']:,} capabilities ({figures['vectors']}; relevance meaningless)\n"
        f"  built in {figures['build_s']} s, graph {figures['graph_s']} s, snapshot written in "
        f"{figures['write_s']} s ({figures['snapshot_mb']} MB); the building process peaked at "
        f"{figures['builder_peak_rss_mb']} MB\n"
        f"  a fresh process mapped it in {figures['load_s']} s ({figures['search']} search): "
        f"RSS {figures['rss_loaded_mb']} MB loaded, {figures['rss_mb']} MB after the queries "
        f"(peak {figures['peak_rss_mb']} MB), against {figures['floor_rss_mb']} MB before the "
        f"load: {figures['rss_mb'] - figures['floor_rss_mb']} MB for the tenant\n"
        f"  cached turn through the discovery service: median {cached['p50']} ms, p99 "
        f"{cached['p99']} ms; floor, the exact scan of one query: median {scan['p50']} ms "
        f"(ratio {cached['p50'] / scan['p50']:.2f})\n"
        f"  a text's first turn on the index (its query vector cached, its BM25 figures not "
        f"yet remembered): median {first['p50']} ms, p99 {first['p99']} ms\n"
        f"  after one change applied as a delta ({figures['delta_s']} s; the new index lives "
        f"in the heap, no longer mapped; {figures['search_after_delta']} search at once, "
        f"{figures['graphs_built_after_delta']} graphs built for it): RSS "
        f"{figures['rss_after_delta_mb']} MB; its memo warmed with the old index's "
        f"{figures['texts_warmed_after_delta']} texts in {figures['warm_after_delta_s']} s (a "
        f"worker does this on a thread of its own after the swap; here before the turns, as in "
        f"the two cases below); cached turn median {delta['p50']} ms, p99 {delta['p99']} ms\n"
        f"  that index written and mapped in its place ({figures['remap_s']} s; the worker does "
        f"not do this): RSS {figures['rss_after_remap_mb']} MB; cached "
        f"turn median {remap['p50']} ms, p99 {remap['p99']} ms\n"
        f"  another fresh process, the change applied apart (a child mapped the snapshot, "
        f"applied it and wrote the result in {figures['apart_child_s']} s, peaking at "
        f"{figures['apart_child_peak_rss_mb']} MB; mapped here {figures['apart_s']} s after "
        f"the start): RSS {figures['apart_rss_mb']} MB before, "
        f"{figures['rss_after_apart_mb']} MB after (peak {figures['peak_rss_apart_mb']} MB); "
        f"cached turn median {apart['p50']} ms, p99 {apart['p99']} ms"
    )


if __name__ == "__main__":
    main()
