"""Memory of one discovery worker at 10,000 and 100,000 capabilities, and its discover latency.

A private Redis gets the benchmark catalog of each size (the Seal-Tools and MetaTool tools, then
provider/region variants, see ``_catalog.py``), written record by record with
:func:`capdisc.registry.store.apply_event` as an indexing worker writes it, with precomputed
vectors:
the embedder's own, or, for ``--embedder minilm`` when ``benchmarks/.cache`` has no MiniLM
vectors for that catalog, the hashing embedder's stored as MiniLM's (the same 384 float32s a
capability, so the same memory; relevance is then meaningless, which the output says).

For each size, ONE real discovery worker (``python -m capdisc_workers.discovery``) starts on
that store; printed: the time from its start to its first heartbeat with the index version
(loading and building the index: it serves from then on), for catalogs above the graph
threshold the time until its heartbeat says the HNSW graph serves, its resident memory (beside
a worker started on an empty registry, and MB per 1,000 capabilities), and the latency of
``Client.discover`` through it over ``--queries`` Seal-Tools queries: first with fresh query
embeddings, then the same queries again (cached embeddings), median and p99, client round trip
and time in the worker.

Then the worker is stopped and a new one started on the same store from the snapshot the first
one wrote (``snapshot_dir``, :mod:`capdisc.discovery.snapshotfile`): its start to serving, to
its graph serving, its memory, and whether it answers the cached-pass queries as the first one
did. Then one capability is changed in the store as an indexing worker changes it; printed:
the time until that worker serves the new version (a delta on the mapped tenant) and its
memory then.

Beside them, the floors of the same run: the bare Redis round trip (PING), the model's own time
for one query and for what a fresh turn embeds (the query and, for a request chaining several,
its parts, as the worker's engine embeds them), back to back and each right after a search of
the same index (as in a worker, whose searches push the model's weights out of the CPU caches),
and, in this process on the same capabilities and vectors, the exact scan of every row against
the graph search (and the search right after the model), with the graph's recall@10 of the
exact answers. ``fresh_beyond_model_ms`` is what a fresh discover took beyond the model's time
for its own texts, query by query (``fresh_beyond_model_after_search_ms``: beyond that time
measured right after a search); ``fresh_beyond_model_in_worker_ms`` beyond the model's time as
the worker itself timed it in that turn (each reply's ``model_ms``).

    .venv/bin/python benchmarks/discovery_memory.py [--sizes 10000,100000 | --size N]
        [--queries 300] [--embedder hashing|minilm] [--json [PATH]]

``--json`` alone prints one JSON object per size on stdout (the report goes to stderr):
``capabilities``, ``rss_mb``, ``peak_rss_mb``, ``start_to_serving_s``, ``graph_ready_s``,
``discover_cached_ms`` and ``discover_fresh_ms`` (``{"p50": .., "p99": ..}``),
``recall_at_10_vs_exact`` (and ``recall_at_10_ties``: ties with the exact 10th count),
``change_served_s``, ``rss_before_change_mb``, ``rss_after_change_mb`` and
``peak_rss_after_change_mb`` (one capability changed after the second worker's queries),
``change_apart`` (when a child process applied it, see ``map_above``: how long that took and
its peak RSS),
``built_apart`` (when the worker had a child process build the tenant, see
``map_above``: how long that took and the child's peak RSS), ``floors``
and ``ratios``; from the snapshot: ``snapshot_written_s`` (from the first start until the
snapshot was on disk), ``snapshot_mb``, ``start_from_snapshot_s``,
``graph_ready_from_snapshot_s``, ``from_snapshot_rss_mb``, ``from_snapshot_same_answers``
(the share of queries answered with the same ids), ``loaded_from_snapshot``; and
``load_average`` (1, 5, 15 minutes) at the start and the end of the size's run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import CACHE, embed_catalog, load_catalog, seal_queries, stand_in_vectors
from _common import percentile
from capdisc.client import Client
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import embed_turn
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import CachedQueryEmbedder, Embedder, Matrix
from capdisc.localredis import start_redis
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_event, tenant_version
from capdisc.resources import embedder_for
from capdisc.retrieval.config import DEFAULT_CONFIG, RetrievalConfig, calibrated_for
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.neighbors import NeighborIndex
from capdisc.retrieval.results import RetrievalResult
from capdisc.retrieval.text import full_text, summary_text, vector_space
from capdisc.settings import Settings
from capdisc.status import live_workers

TENANT = "bench"
LOG = Path(tempfile.gettempdir()) / "capdisc-bench-discovery-memory.log"
READY_TIMEOUT_S = 900.0
SETTLE_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="10000,100000", help="comma-separated registry sizes, one worker each"
    )
    parser.add_argument(
        "--size", type=int, default=None, help="one registry size (overrides --sizes)"
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument(
        "--embedder",
        choices=["hashing", "minilm"],
        default="hashing",
        help="the worker's CAPDISC_EMBEDDER (query embeddings)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        help="print one JSON object per size on stdout (or write all figures to PATH)",
    )
    args = parser.parse_args()
    if args.json == "-":
        sys.stdout = sys.stderr  # the report; the JSON objects go to the real stdout
    sizes = (
        [args.size] if args.size else sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    )
    embedder = embedder_for(Settings.load({**os.environ, "CAPDISC_EMBEDDER": args.embedder}))
    caps = load_catalog(max(sizes))
    queries = list(dict.fromkeys(seal_queries()))[: args.queries]
    print(f"worker embedder {embedder.id}; {len(queries)} Seal-Tools queries; worker log {LOG}")
    with tempfile.TemporaryDirectory(prefix="capdisc-memory-") as tmp:
        server = start_redis(Path(tmp) / "redis", durable=False)
        try:
            idle = measure_idle(server.url, args.embedder)
            results = [
                measure_size(server.url, caps[:size], embedder, args.embedder, queries, idle)
                for size in sizes
            ]
        finally:
            server.stop()
    print_summary(idle, results)
    if args.json == "-":
        for result in results:
            print(json.dumps(summary_object(result)), file=sys.__stdout__)
    elif args.json:
        Path(args.json).write_text(
            json.dumps({"embedder": embedder.id, "idle": idle, "sizes": results}, indent=2) + "\n"
        )
        print(f"figures written to {args.json}")


# -- the worker process ----------------------------------------------------------------------


def worker_env(url: str, embedder: str, snapshots: Path | None) -> dict[str, str]:
    return {
        **os.environ,
        "CAPDISC_REDIS_URL": url,
        "CAPDISC_EMBEDDER": embedder,
        "CAPDISC_LOG_LEVEL": "INFO" if snapshots is not None else "WARNING",
        "CAPDISC_SNAPSHOT_DIR": str(snapshots) if snapshots is not None else "",
    }


def spawn_worker(url: str, embedder: str, snapshots: Path | None = None) -> subprocess.Popen[bytes]:
    with LOG.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "capdisc_workers.discovery"],
            env=worker_env(url, embedder, snapshots),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_snapshot(
    snapshots: Path, version: int, worker: subprocess.Popen[bytes], started: float
) -> tuple[float, float]:
    """Seconds from ``started`` until the worker's snapshot of ``version`` is on disk, and its
    size (MB)."""
    deadline = started + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the discovery worker exited (code {worker.returncode}); see {LOG}")
        for path in snapshots.glob(f"{TENANT}/*/v{version:012d}-*"):
            size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
            return time.perf_counter() - started, size
        time.sleep(0.05)
    raise SystemExit(f"the worker wrote no snapshot in {READY_TIMEOUT_S:.0f} s; see {LOG}")


def log_events(offset: int, event: str) -> list[dict[str, Any]]:
    """The JSON lines of the worker log after byte ``offset`` whose event is ``event``."""
    with LOG.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def wait_ready(
    client: redis.Redis, worker: subprocess.Popen[bytes], version: int | None, started: float
) -> float:
    """Seconds from ``started`` to the worker's first heartbeat (sent once its indexes are
    built), serving ``version`` of the tenant when one is given."""
    deadline = started + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the discovery worker exited (code {worker.returncode}); see {LOG}")
        for beat in live_workers(client):
            if beat.get("pid") == worker.pid and (
                version is None or beat.get("versions", {}).get(TENANT) == version
            ):
                return time.perf_counter() - started
        time.sleep(0.05)
    raise SystemExit(f"the discovery worker was not ready in {READY_TIMEOUT_S:.0f} s; see {LOG}")


def wait_graph(client: redis.Redis, worker: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from ``started`` until the worker's heartbeat says the HNSW graph serves."""
    deadline = started + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the discovery worker exited (code {worker.returncode}); see {LOG}")
        for beat in live_workers(client):
            if beat.get("pid") == worker.pid and beat.get("searches", {}).get(TENANT) == "graph":
                return time.perf_counter() - started
        time.sleep(0.05)
    raise SystemExit(f"the worker's graph was not ready in {READY_TIMEOUT_S:.0f} s; see {LOG}")


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(timeout=15)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def memory_mb(pid: int) -> dict[str, float | None]:
    """Resident memory now and at its peak (``VmHWM``), in MB: psutil when installed, else
    ``/proc/PID/status``."""
    status = _proc_status(pid)
    try:
        import psutil

        rss: float | None = psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        rss = status.get("VmRSS")
    return {"rss_mb": _round(rss), "peak_mb": _round(status.get("VmHWM"))}


def _proc_status(pid: int) -> dict[str, float]:
    """The ``kB`` fields of ``/proc/PID/status`` in MB (empty off Linux)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in lines if line.endswith(" kB"))
    return {name: int(value.split()[0]) / 1024 for name, value in fields}


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


# -- the store ---------------------------------------------------------------------------------


def catalog_vectors(caps: list[Capability], embedder: Embedder) -> tuple[Matrix, str]:
    """Stored vectors for ``caps`` in ``embedder``'s space, and where they came from."""
    if isinstance(embedder, HashingEmbedder):
        return stand_in_vectors(caps, embedder), f"{embedder.id} (the worker's embedder)"
    if minilm_cached(caps, embedder.id):
        return embed_catalog(caps, embedder), f"{embedder.id}, from benchmarks/.cache"
    stand_in = HashingEmbedder(embedder.dim)
    return stand_in_vectors(caps, stand_in), (
        f"{stand_in.id} stand-ins stored as {embedder.id} (no cached MiniLM vectors for this "
        f"catalog; same {embedder.dim} dims so the same memory, relevance meaningless)"
    )


def minilm_cached(caps: list[Capability], embedder_id: str) -> bool:
    """Whether ``_catalog.embed_catalog`` has both texts' vectors on disk (same cache names)."""
    return all(
        _cache_path([text(c) for c in caps], embedder_id).exists()
        for text in (full_text, summary_text)
    )


def _cache_path(texts: list[str], embedder_id: str) -> Path:
    digest = hashlib.sha256("\n\x00".join(texts).encode()).hexdigest()[:24]
    return CACHE / f"{embedder_id}-{digest}.npy"


def load_store(url: str, caps: list[Capability], matrix: Matrix, embedder_id: str) -> float:
    """Empty the store, then write ``caps`` one event at a time as an indexing worker does."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    space = vector_space(embedder_id)
    started = time.perf_counter()
    for index, cap in enumerate(caps):
        event = RegistryEvent(
            type="upsert", tenant=TENANT, capability_id=cap.id, seq=1, capability=cap.to_dict()
        )
        vector = matrix[index].tobytes()
        apply_event(client, event, cap, lambda _c, v=vector: v, space)
    return time.perf_counter() - started


# -- measurements ------------------------------------------------------------------------------


def measure_idle(url: str, embedder: str) -> dict[str, Any]:
    """A worker on an empty registry: its start-to-ready time and memory."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    started = time.perf_counter()
    worker = spawn_worker(url, embedder)
    try:
        ready_s = wait_ready(client, worker, None, started)
        time.sleep(SETTLE_S)
        idle = {"ready_s": round(ready_s, 2), **memory_mb(worker.pid)}
    finally:
        stop_worker(worker)
    print(
        f"idle worker (empty registry): ready in {idle['ready_s']:.2f} s, RSS "
        f"{idle['rss_mb']} MB (peak {idle['peak_mb']} MB)"
    )
    return idle


def measure_size(
    url: str,
    caps: list[Capability],
    embedder: Embedder,
    embedder_name: str,
    queries: list[str],
    idle: dict[str, Any],
) -> dict[str, Any]:
    started = time.perf_counter()
    matrix, source = catalog_vectors(caps, embedder)
    vectors_s = time.perf_counter() - started
    store_s = load_store(url, caps, matrix, embedder.id)
    search = in_process_search(caps, matrix, embedder, queries)
    first_vector = matrix[0].tobytes()
    del matrix
    print(
        f"\n{len(caps):,} capabilities; vectors: {source} ({vectors_s:.1f} s); stored in "
        f"Redis in {store_s:.1f} s"
    )
    client = redis.Redis.from_url(url)
    version = tenant_version(client, TENANT)
    load_before = os.getloadavg()
    snapshots = Path(tempfile.mkdtemp(prefix="capdisc-snapshots-"))
    offset = LOG.stat().st_size
    started = time.perf_counter()
    worker = spawn_worker(url, embedder_name, snapshots)
    try:
        ready_s = wait_ready(client, worker, version, started)
        apart = log_events(offset, "index_built_apart")
        graph_s = (
            wait_graph(client, worker, started) if len(caps) > DEFAULT_CONFIG.ann_above else None
        )
        # the snapshot is written once the graph is built: waited for here, so that writing it
        # does not share the cores with the latency passes below
        written_s, snapshot_mb = wait_snapshot(snapshots, version, worker, started)
        time.sleep(SETTLE_S)
        loaded = memory_mb(worker.pid)
        latency = measure_latency(url, queries, version)
        served = memory_mb(worker.pid)
    finally:
        stop_worker(worker)
    restart = measure_restart(
        url,
        embedder_name,
        snapshots,
        version,
        queries,
        latency.pop("answers"),
        lambda redis_client, restarted: measure_change(
            redis_client, restarted, caps[0], first_vector, embedder.id
        ),
    )
    shutil.rmtree(snapshots, ignore_errors=True)
    result = {
        "size": len(caps),
        "vectors": source,
        "store_s": round(store_s, 1),
        "ready_s": round(ready_s, 2),
        "graph_ready_s": round(graph_s, 2) if graph_s is not None else None,
        "built_apart": {k: apart[0].get(k) for k in ("took_s", "child_peak_rss_mb")}
        if apart
        else None,
        "loaded": loaded,
        "after_queries": served,
        **latency,
        "floors": {**floors(url, embedder, queries), **search["floors"]},
        "recall_at_10_vs_exact": search["recall_at_10_vs_exact"],
        "recall_at_10_ties": search["recall_at_10_ties"],
        "snapshot_written_s": round(written_s, 2),
        "snapshot_mb": round(snapshot_mb, 1),
        **restart,
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    fresh_each = result["fresh"].pop("each_ms")
    result["cached"].pop("each_ms")
    model_each = result["floors"].pop("model_turn_each_ms")
    after_each = result["floors"].pop("model_turn_after_search_each_ms")
    result["fresh_beyond_model_ms"] = beyond_model(fresh_each, model_each)
    result["fresh_beyond_model_after_search_ms"] = beyond_model(fresh_each, after_each)
    result["ratios"] = ratios(result)
    result["mb_per_1k"] = per_1k(result, idle)
    print_size(result, idle)
    return result


def measure_change(
    client: redis.Redis,
    worker: subprocess.Popen[bytes],
    capability: Capability,
    vector: bytes,
    embedder_id: str,
) -> dict[str, Any]:
    """One capability's description edited as an indexing worker writes it; the seconds until
    the worker serves the new version (it applies it as a delta) and its memory then."""
    edited = replace(capability, description="Edited for the benchmark.")
    event = RegistryEvent(
        type="upsert", tenant=TENANT, capability_id=edited.id, seq=2, capability=edited.to_dict()
    )
    before = memory_mb(worker.pid)  # after its queries: the pages they touch resident
    offset = LOG.stat().st_size
    started = time.perf_counter()
    apply_event(client, event, edited, lambda _c: vector, vector_space(embedder_id))
    served_s = wait_ready(client, worker, tenant_version(client, TENANT), started)
    time.sleep(SETTLE_S)
    apart = log_events(offset, "index_changed_apart")
    return {
        "change_served_s": round(served_s, 2),
        "before_change": before,
        "after_change": memory_mb(worker.pid),
        "change_apart": (
            {k: apart[0].get(k) for k in ("took_s", "child_peak_rss_mb")} if apart else None
        ),
    }


def measure_restart(
    url: str,
    embedder_name: str,
    snapshots: Path,
    version: int,
    queries: list[str],
    first: list[list[str]],
    change: Callable[[redis.Redis, subprocess.Popen[bytes]], dict[str, Any]],
) -> dict[str, Any]:
    """A new worker started on the same store and the snapshot the first one wrote: its start
    to serving and to its graph serving, its memory, whether it loaded from the snapshot (its
    log says so), and the share of the cached-pass queries it answers with the same ids; then
    ``change`` (:func:`measure_change`) on it."""
    client = redis.Redis.from_url(url)
    offset = LOG.stat().st_size
    started = time.perf_counter()
    worker = spawn_worker(url, embedder_name, snapshots)
    try:
        ready_s = wait_ready(client, worker, version, started)
        graph_s = wait_graph(client, worker, started) if _above_ann(snapshots) else None
        time.sleep(SETTLE_S)
        memory = memory_mb(worker.pid)
        with Client.from_url(url, tenant=TENANT, timeout_s=120) as asker:
            again = [asker.discover(q).ids for q in queries]
        changed = change(client, worker)
    finally:
        stop_worker(worker)
    same = sum(a == b for a, b in zip(first, again, strict=True)) / max(len(first), 1)
    loaded = log_events(offset, "index_loaded_from_snapshot")
    refused = log_events(offset, "snapshot_refused")
    return {
        "start_from_snapshot_s": round(ready_s, 2),
        "graph_ready_from_snapshot_s": round(graph_s, 2) if graph_s is not None else None,
        "from_snapshot": memory,
        "from_snapshot_same_answers": round(same, 4),
        "loaded_from_snapshot": bool(loaded) and not refused,
        "snapshot_load_s": loaded[0].get("took_s") if loaded else None,
        "snapshot_refused": [r.get("reason") for r in refused],
        **changed,
    }


def _above_ann(snapshots: Path) -> bool:
    """Whether the snapshot holds a catalog above the graph threshold (it has a graph file)."""
    return any(snapshots.glob(f"{TENANT}/*/v*/graph.faiss"))


def measure_latency(url: str, queries: list[str], version: int) -> dict[str, Any]:
    """``Client.discover`` over ``queries``: first pass fresh (the store was just emptied, so no
    query vector is cached in Redis or the worker), second pass the same queries, cached."""
    with Client.from_url(url, tenant=TENANT, timeout_s=120) as client:
        answer = client.discover("warm up", min_version=version)
        assert answer.index_version == version, answer.index_version
        fresh = timed(client, queries)
        answers: list[list[str]] = []
        cached = timed(client, queries, answers)
    return {"fresh": fresh, "cached": cached, "answers": answers}


def timed(
    client: Client, queries: list[str], answers: list[list[str]] | None = None
) -> dict[str, Any]:
    """Round-trip and in-worker latency (ms), median and p99, of one pass over ``queries``
    (each answer's ids appended to ``answers`` when given)."""
    round_trip: list[float] = []
    in_worker: list[float] = []
    model: list[float] = []
    for query in queries:
        started = time.perf_counter()
        answer = client.discover(query)
        round_trip.append((time.perf_counter() - started) * 1000)
        in_worker.append(answer.took_ms)
        model.append(answer.model_ms)
        if answers is not None:
            answers.append(answer.ids)
    return {
        "round_trip_ms": _stats(round_trip),
        "in_worker_ms": _stats(in_worker),
        "model_in_worker_ms": _stats(model),
        "beyond_model_in_worker_ms": _stats(
            [t - m for t, m in zip(round_trip, model, strict=True)]
        ),
        "each_ms": [round(v, 3) for v in round_trip],
    }


def _stats(values_ms: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values_ms), 2),
        "p99": round(percentile(values_ms, 99), 2),
        "n": len(values_ms),
    }


def in_process_search(
    caps: list[Capability], matrix: Matrix, embedder: Embedder, queries: list[str]
) -> dict[str, Any]:
    """On the worker's capabilities and vectors, in this process: the exact scan of every row
    against the graph search (cached query vectors), and the graph's recall@10 of the exact
    answers (catalogs at or below the graph threshold: the exact scan only)."""
    config = calibrated_for(embedder.id)  # the worker's knobs
    index = RetrievalIndex.build(caps, matrix, config=config)
    vectors = embedder.embed(queries)
    exact_ms, exact = _search_pass(index, queries, vectors, embedder, config)
    figures: dict[str, Any] = {"exact_scan_ms": _p50_p99(exact_ms)}
    recall = tied = None
    if len(caps) > config.ann_above:
        index.neighbors.fill(NeighborIndex(index.matrix))
        graph_ms, found = _search_pass(index, queries, vectors, embedder, config)
        figures["graph_search_ms"] = _p50_p99(graph_ms)
        recall, tied = recall_at_10(exact, found)
    after_search, after_model = model_after_search(index, queries, vectors, embedder, config)
    figures["model_turn_after_search_ms"] = _p50_p99(after_search)
    figures["search_after_model_ms"] = _p50_p99(after_model)
    figures["model_turn_after_search_each_ms"] = [round(v, 3) for v in after_search]
    shown = {k: v for k, v in figures.items() if not k.endswith("_each_ms")}
    print(
        f"  in this process: {shown}; recall@10 of the exact answers: {recall} "
        f"(counting an answer scored as high as the exact 10th: {tied})"
    )
    return {"floors": figures, "recall_at_10_vs_exact": recall, "recall_at_10_ties": tied}


def model_after_search(
    index: RetrievalIndex,
    queries: list[str],
    vectors: Matrix,
    embedder: Embedder,
    config: RetrievalConfig,
) -> tuple[list[float], list[float]]:
    """A fresh turn's two halves as a worker runs them, query by query: the model's own time
    for the turn's texts (as :func:`floors` times them) right after a search of ``index`` for
    the query before it, then the search for this query right after its model calls. In a
    serving process each half pushes the other's data out of the CPU caches; back to back,
    neither does."""
    model_ms, search_ms = [], []
    before = zip([*queries[-1:], *queries[:-1]], [*vectors[-1:], *vectors[:-1]], strict=True)
    for (previous, previous_vector), query, vector in zip(before, queries, vectors, strict=True):
        index.search(previous, previous_vector, 10, embed=embedder.embed, config=config)
        model_ms.append(model_turn_ms(embedder, query))
        started = time.perf_counter()
        index.search(query, vector, 10, embed=embedder.embed, config=config)
        search_ms.append((time.perf_counter() - started) * 1000)
    return model_ms, search_ms


def recall_at_10(exact: list[RetrievalResult], found: list[RetrievalResult]) -> tuple[float, float]:
    """The share of the exact answers' ids the graph search returns, and the share of its
    answers scored at least as high as the exact 10th (a catalog of near-identical variants
    has many ties there, and either of two tied rows is as right as the other)."""
    ids, tied = [], []
    for want, got in zip(exact, found, strict=True):
        if not want.entries:
            continue
        ids.append(len(set(want.ids) & set(got.ids)) / len(want.ids))
        floor = want.entries[-1].score - 1e-6
        good = [e for e in got.entries if e.capability_id in want.ids or e.score >= floor]
        tied.append(min(len(good), len(want.ids)) / len(want.ids))
    return round(statistics.fmean(ids), 4), round(statistics.fmean(tied), 4)


def _search_pass(
    index: RetrievalIndex,
    queries: list[str],
    vectors: Matrix,
    embedder: Embedder,
    config: RetrievalConfig,
) -> tuple[list[float], list[RetrievalResult]]:
    took: list[float] = []
    found: list[RetrievalResult] = []
    for query, vector in zip(queries, vectors, strict=True):
        started = time.perf_counter()
        result = index.search(query, vector, 10, embed=embedder.embed, config=config)
        took.append((time.perf_counter() - started) * 1000)
        found.append(result)
    return took, found


def floors(url: str, embedder: Embedder, queries: list[str]) -> dict[str, Any]:
    """The bare Redis round trip (PING), the model's own time for one query (one pass over its
    whole text), and the model's own time for what a fresh turn embeds: the query and, for a
    request chaining several, its parts, as the worker's engine embeds them
    (:func:`capdisc.discovery.engine.embed_turn` with the default config and an empty cache),
    back to back in this process, for every query."""
    client = redis.Redis.from_url(url)
    pings = []
    for _ in range(500):
        started = time.perf_counter()
        client.ping()
        pings.append((time.perf_counter() - started) * 1000)
    model = []
    for query in queries[:100]:
        started = time.perf_counter()
        embedder.embed([query])
        model.append((time.perf_counter() - started) * 1000)
    turn = [model_turn_ms(embedder, query) for query in queries]
    return {
        "redis_round_trip_ms": _p50_p99(pings),
        "model_query_ms": _p50_p99(model),
        "model_turn_ms": _p50_p99(turn),
        "model_turn_each_ms": [round(v, 3) for v in turn],
    }


def model_turn_ms(embedder: Embedder, query: str) -> float:
    """The model's time for what a fresh turn of ``query`` embeds, as the worker's engine
    embeds it (:func:`capdisc.discovery.engine.embed_turn`, default config, empty cache), as
    the query embedder counts it for a reply's ``model_ms``."""
    queries = CachedQueryEmbedder(embedder)
    embed_turn(queries, query, DiscoveryConfig())
    return queries.take_model_ms()


def beyond_model(fresh_each_ms: list[float], model_each_ms: list[float]) -> dict[str, float]:
    """What a fresh turn costs beyond the model's own time for its texts, query by query
    (median and p99 of the differences)."""
    gaps = [f - m for f, m in zip(fresh_each_ms, model_each_ms, strict=True)]
    return {"p50": round(statistics.median(gaps), 3), "p99": round(percentile(gaps, 99), 3)}


def _p50_p99(values_ms: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values_ms), 3),
        "p99": round(percentile(values_ms, 99), 3),
    }


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """Each latency over its floor: cached discover over the Redis round trip, fresh discover
    over the model's time for the turn's texts plus the round trip, the graph search over the
    exact scan."""
    f = result["floors"]
    ping, model = f["redis_round_trip_ms"]["p50"], f["model_turn_ms"]["p50"]
    out = {
        "cached_over_redis": round(result["cached"]["round_trip_ms"]["median"] / ping, 2),
        "fresh_over_model_and_redis": round(
            result["fresh"]["round_trip_ms"]["median"] / (model + ping), 2
        ),
    }
    if "graph_search_ms" in f:
        out["graph_over_exact_scan"] = round(
            f["graph_search_ms"]["p50"] / f["exact_scan_ms"]["p50"], 3
        )
    return out


def summary_object(result: dict[str, Any]) -> dict[str, Any]:
    """The one-line JSON figures of one size."""

    def pair(stats: dict[str, float]) -> dict[str, float]:
        return {"p50": stats["median"], "p99": stats["p99"]}

    return {
        "capabilities": result["size"],
        "vectors": result["vectors"],
        "rss_mb": result["after_queries"]["rss_mb"],
        "peak_rss_mb": result["after_queries"]["peak_mb"],
        "change_served_s": result["change_served_s"],
        "rss_before_change_mb": result["before_change"]["rss_mb"],
        "rss_after_change_mb": result["after_change"]["rss_mb"],
        "peak_rss_after_change_mb": result["after_change"]["peak_mb"],
        "change_apart": result["change_apart"],
        "start_to_serving_s": result["ready_s"],
        "graph_ready_s": result["graph_ready_s"],
        "built_apart": result["built_apart"],
        "discover_cached_ms": pair(result["cached"]["round_trip_ms"]),
        "discover_fresh_ms": pair(result["fresh"]["round_trip_ms"]),
        "fresh_beyond_model_ms": result["fresh_beyond_model_ms"],
        "fresh_beyond_model_after_search_ms": result["fresh_beyond_model_after_search_ms"],
        "fresh_beyond_model_in_worker_ms": pair(result["fresh"]["beyond_model_in_worker_ms"]),
        "model_in_worker_ms": pair(result["fresh"]["model_in_worker_ms"]),
        "recall_at_10_vs_exact": result["recall_at_10_vs_exact"],
        "recall_at_10_ties": result["recall_at_10_ties"],
        "floors": result["floors"],
        "ratios": result["ratios"],
        "snapshot_written_s": result["snapshot_written_s"],
        "snapshot_mb": result["snapshot_mb"],
        "start_from_snapshot_s": result["start_from_snapshot_s"],
        "graph_ready_from_snapshot_s": result["graph_ready_from_snapshot_s"],
        "from_snapshot_rss_mb": result["from_snapshot"]["rss_mb"],
        "from_snapshot_same_answers": result["from_snapshot_same_answers"],
        "loaded_from_snapshot": result["loaded_from_snapshot"],
        "load_average": result["load_average"],
    }


# -- output ------------------------------------------------------------------------------------


def per_1k(result: dict[str, Any], idle: dict[str, Any]) -> float | None:
    rss, base = result["loaded"]["rss_mb"], idle["rss_mb"]
    if rss is None or base is None:
        return None
    return round((rss - base) / (result["size"] / 1000), 2)


def print_size(result: dict[str, Any], idle: dict[str, Any]) -> None:
    loaded, served = result["loaded"], result["after_queries"]
    print(
        f"  worker start to ready (index version served): {result['ready_s']:.2f} s; about "
        f"{result['ready_s'] - idle['ready_s']:.2f} s more than on an empty registry "
        "(reading and building the index)"
    )
    print(
        f"  RSS ready: {loaded['rss_mb']} MB (peak so far {loaded['peak_mb']} MB); idle "
        f"{idle['rss_mb']} MB; {result['mb_per_1k']} MB per 1,000 capabilities"
    )
    print(f"  RSS after the queries: {served['rss_mb']} MB (peak {served['peak_mb']} MB)")
    apart = result["built_apart"]
    if apart is not None:
        print(
            f"  built by a child process ({apart['took_s']} s, its peak RSS "
            f"{apart['child_peak_rss_mb']} MB, freed when it exited) and mapped by the worker"
        )
    if result["graph_ready_s"] is not None:
        print(f"  start to the HNSW graph serving: {result['graph_ready_s']:.2f} s")
    graph_again = result["graph_ready_from_snapshot_s"]
    print(
        f"  snapshot on disk {result['snapshot_written_s']:.2f} s after the start "
        f"({result['snapshot_mb']} MB); a new worker started from it: serving in "
        f"{result['start_from_snapshot_s']:.2f} s"
        + (f", its graph serving in {graph_again:.2f} s" if graph_again is not None else "")
        + f" (loaded from the snapshot: {result['loaded_from_snapshot']}, in "
        f"{result['snapshot_load_s']} s; RSS {result['from_snapshot']['rss_mb']} MB; same "
        f"answers as the first worker: {result['from_snapshot_same_answers']:.1%})"
    )
    changed = result["after_change"]
    print(
        f"  that worker, after its queries: RSS {result['before_change']['rss_mb']} MB (peak "
        f"{result['before_change']['peak_mb']} MB); one capability then changed: served in "
        f"{result['change_served_s']:.2f} s; RSS then {changed['rss_mb']} MB (peak "
        f"{changed['peak_mb']} MB)"
    )
    if result["change_apart"] is not None:
        print(
            f"  that change applied by a child process ({result['change_apart']['took_s']} s, "
            f"its peak RSS {result['change_apart']['child_peak_rss_mb']} MB) and mapped"
        )
    if result["snapshot_refused"]:
        print(f"  snapshot refused: {result['snapshot_refused']}")
    print(f"  load average (1, 5, 15 min) before and after: {result['load_average']}")
    f = result["floors"]
    print(
        f"  floors: Redis PING {f['redis_round_trip_ms']['p50']:.3f} ms, the model for one "
        f"query {f['model_query_ms']['p50']:.3f} ms, for a fresh turn's texts (the query and "
        f"its parts) {f['model_turn_ms']['p50']:.3f} ms, the exact scan in-process "
        f"{f['exact_scan_ms']['p50']:.3f} ms (graph search in-process: "
        f"{f.get('graph_search_ms', {}).get('p50', 'n/a')} ms); recall@10 of exact: "
        f"{result['recall_at_10_vs_exact']}"
    )
    print(f"  ratios to the floors: {result['ratios']}")
    gap, after = result["fresh_beyond_model_ms"], result["fresh_beyond_model_after_search_ms"]
    print(
        f"  a fresh discover beyond the model's time for its texts, query by query: median "
        f"{gap['p50']:.2f} ms, p99 {gap['p99']:.2f} ms (beyond the model's time right after a "
        f"search, {f['model_turn_after_search_ms']['p50']:.3f} ms: median {after['p50']:.2f} "
        f"ms, p99 {after['p99']:.2f} ms); in this process, the search right after the model "
        f"{f['search_after_model_ms']['p50']:.3f} ms"
    )
    model, beyond = (
        result["fresh"]["model_in_worker_ms"],
        result["fresh"]["beyond_model_in_worker_ms"],
    )
    print(
        f"  the model as the worker timed it in each fresh turn (its reply's model_ms): median "
        f"{model['median']:.2f} ms, p99 {model['p99']:.2f} ms; each fresh discover beyond it: "
        f"median {beyond['median']:.2f} ms, p99 {beyond['p99']:.2f} ms"
    )
    for label in ("fresh", "cached"):
        trip, inside = result[label]["round_trip_ms"], result[label]["in_worker_ms"]
        print(
            f"  discover, {label} query embedding: median {trip['median']:.2f} ms, p99 "
            f"{trip['p99']:.2f} ms (in the worker: median {inside['median']:.2f} ms, p99 "
            f"{inside['p99']:.2f} ms; n={trip['n']})"
        )


def print_summary(idle: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print(
        f"\n{'capabilities':>12} {'ready s':>8} {'snap s':>7} {'RSS MB':>8} {'MB/1k':>7} "
        f"{'fresh med/p99 ms':>18} {'cached med/p99 ms':>18}"
    )
    print(f"{0:>12} {idle['ready_s']:>8.2f} {'':>7} {idle['rss_mb']:>8}")
    for r in results:
        fresh, cached = r["fresh"]["round_trip_ms"], r["cached"]["round_trip_ms"]
        print(
            f"{r['size']:>12,} {r['ready_s']:>8.2f} {r['start_from_snapshot_s']:>7.2f} "
            f"{r['loaded']['rss_mb']:>8} "
            f"{r['mb_per_1k']!s:>7} {fresh['median']:>8.2f} / {fresh['p99']:<7.2f} "
            f"{cached['median']:>8.2f} / {cached['p99']:<7.2f}"
        )


if __name__ == "__main__":
    main()
