"""Per-turn discovery speed at registry scale, beside the Redis floors of the same run.

1. the engine in-process with cached query embeddings, then with nothing cached: each query
   with its sub-queries embedded as by default, always pooled from its own pass and always on
   their own, in turn;
2. the bare Redis request/reply floor (BLPOP/RPUSH between two processes) and capdisc's own
   transport floor (stream + consumer group + reply list) with an echo worker that does nothing;
3. through Redis and one discovery worker, with a cached and with a fresh query embedding, for
   the Seal-Tools queries (most chain several requests) and for one-request agent turns: back
   to back, and then, from a new worker with empty caches, each turn 200 ms after the last
   (an agent's turns reach an idle worker);
4. the throughput of two discovery workers on this machine, cached embeddings, closed-loop
   clients in two processes.

Above the graph threshold (``RetrievalConfig.ann_above``), step 1 runs twice on one snapshot:
first with the exact scan of every row (the floor the graph is measured against), then once its
HNSW graph is built, with the graph's recall@10 of the exact scan's answers.

``--stand-ins`` stores hashing-embedder vectors of the same 384 float32s instead of MiniLM's
(embedding a million capabilities with MiniLM takes hours here): the same memory and the same
arithmetic per query, relevance meaningless; the output says so. ``--in-process-only`` stops
after step 1.

    .venv/bin/python benchmarks/discovery_speed.py [--size 10000] [--seconds 10]
                                                   [--stand-ins] [--in-process-only]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import embed_catalog, load_catalog, seal_queries, stand_in_vectors
from _common import percentile
from capdisc import keys
from capdisc.client import Client
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import Query, discover, embed_turn
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.service import Context, answer
from capdisc.discovery.snapshot import IndexSnapshot, hybrid_retriever
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.minilm import MiniLMEmbedder
from capdisc.embedders.port import CachedQueryEmbedder, Embedder
from capdisc.filters import SearchFilters
from capdisc.localredis import start_redis
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_event
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.neighbors import BackgroundBuilder, NeighborIndex
from capdisc.retrieval.probes import PROBES
from capdisc.retrieval.text import vector_space
from capdisc.sessions.policy import SessionPolicy

HERE = Path(__file__).resolve().parent
TENANT = "bench"
#: Think time between an agent's turns in the idle-worker measurement, and how many of the
#: Seal-Tools queries it asks.
IDLE_S = 0.2
IDLE_TURNS = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--stand-ins",
        action="store_true",
        help="hashing-embedder vectors (same size) instead of MiniLM's; relevance meaningless",
    )
    parser.add_argument("--in-process-only", action="store_true", help="stop after step 1")
    args = parser.parse_args()
    embedder: Embedder = HashingEmbedder(384) if args.stand_ins else MiniLMEmbedder()
    if args.stand_ins:
        os.environ["CAPDISC_EMBEDDER"] = "hashing"  # the workers embed queries the same way
    caps = load_catalog(args.size)
    matrix = stand_in_vectors(caps, embedder) if args.stand_ins else embed_catalog(caps, embedder)
    queries = seal_queries()[: args.queries]
    print(
        f"catalog: {len(caps)} capabilities, {len(queries)} queries, embedder {embedder.id}"
        + (
            " (stand-in vectors: speed and memory only, relevance meaningless)"
            if args.stand_ins
            else ""
        )
    )
    in_process(caps, matrix, queries, embedder)
    if args.in_process_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp) / "redis", durable=False)
        try:
            load_registry(server.url, caps, matrix, embedder.id)
            floors = measure_floors(server.url)
            through_workers(server.url, queries, floors, args.seconds)
        finally:
            server.stop()


def report(label: str, samples_s: list[float], floor_ms: float | None = None) -> float:
    ms = [s * 1000 for s in samples_s]
    median = float(np.median(ms))
    ratio = f", {median / floor_ms:.1f}x the floor" if floor_ms else ""
    print(
        f"{label:<58} median {median:6.2f} ms  p99 {percentile(ms, 99):6.2f} ms  "
        f"(p99/median {percentile(ms, 99) / median:.1f}{ratio}, n={len(ms)})"
    )
    return median


def in_process(caps: list, matrix: np.ndarray, queries: list[str], embedder: Embedder) -> None:
    gate = threading.Event()  # the graph is built when the exact pass is done

    def build_after_exact_pass(rows: np.ndarray) -> NeighborIndex:
        gate.wait()
        return NeighborIndex(rows)

    builder = BackgroundBuilder(build_after_exact_pass)
    started = time.perf_counter()
    snapshot = IndexSnapshot.build(
        TENANT,
        1,
        embedder.dim,
        ((c, matrix[i].tobytes()) for i, c in enumerate(caps)),
        embedder.id,
        functools.partial(hybrid_retriever, builder=builder),
        probes=embedder.embed(list(PROBES)),
    )
    print(
        f"snapshot build (BM25, vectors, names) for {len(caps)}: "
        f"{time.perf_counter() - started:.2f} s"
    )
    config = DiscoveryConfig()
    cached = CachedQueryEmbedder(embedder)
    for query in queries:  # warm the cache: the query and its sub-queries
        turn(snapshot, cached, query, config)
    large = len(caps) > DEFAULT_CONFIG.ann_above
    exact_floor = cached_turns(snapshot, cached, queries, config, "exact scan" if large else "")
    if large:
        exact_ids = retrieved(snapshot, cached, queries, config)
        gate.set()
        started = time.perf_counter()
        builder.idle(7200)
        print(f"HNSW graph of {len(caps)} rows built in {time.perf_counter() - started:.1f} s")
        cached_turns(snapshot, cached, queries, config, "graph", exact_floor)
        graph_ids = retrieved(snapshot, cached, queries, config)
        shares = [
            len(set(a) & set(b)) / len(a) for a, b in zip(exact_ids, graph_ids, strict=True) if a
        ]
        print(f"  recall@10 of the graph search against the exact scan: {np.mean(shares):.4f}")
    fresh_turns(snapshot, embedder, queries, config)


def retrieved(
    snapshot: IndexSnapshot,
    cached: CachedQueryEmbedder,
    queries: list[str],
    config: DiscoveryConfig,
) -> list[tuple[str, ...]]:
    """The retriever's top 10 ids per query."""
    out = []
    for query in queries:
        vector, embed = embed_turn(cached, query, config)
        hits = snapshot.retriever.search(query, vector, 10, SearchFilters(), config, embed).hits
        out.append(tuple(h.id for h in hits))
    return out


def cached_turns(
    snapshot: IndexSnapshot,
    cached: CachedQueryEmbedder,
    queries: list[str],
    config: DiscoveryConfig,
    how: str,
    floor_ms: float | None = None,
) -> float:
    samples = []
    for query in queries:
        started = time.perf_counter()
        turn(snapshot, cached, query, config)
        samples.append(time.perf_counter() - started)
    label = "discovery service in-process, query embedding cached"
    median = report(f"{label}{f' ({how})' if how else ''}", samples, floor_ms)
    chained = [len(decompose(q)) > 1 for q in queries]
    report("  one-request queries", [s for s, c in zip(samples, chained, strict=True) if not c])
    report(
        "  queries chaining several requests",
        [s for s, c in zip(samples, chained, strict=True) if c],
    )
    return median


def fresh_turns(
    snapshot: IndexSnapshot, embedder: Embedder, queries: list[str], config: DiscoveryConfig
) -> None:
    """Turns with nothing cached, each query in turn with the default (a request's parts each
    embedded on their own up to three parts, pooled from its own pass above), with the parts
    always pooled and always on their own, so the three see the same machine."""
    modes = {
        "parts on their own up to 3 (default)": config,
        "parts always pooled from the query's pass": config.merged({"pooled_parts_above": 0}),
        "parts always on their own": config.merged({"pooled_parts_above": 1_000}),
    }
    sample = queries[:: max(1, len(queries) // 100)][:100]  # as many chained as in the whole
    samples: dict[str, list[float]] = {name: [] for name in modes}
    for query in sample:
        for name, mode in modes.items():
            fresh = CachedQueryEmbedder(embedder, 0)
            started = time.perf_counter()
            vector, embed = embed_turn(fresh, query, mode)
            discover(snapshot, Query(query), vector, mode, embed)
            samples[name].append(time.perf_counter() - started)
    chained = [len(decompose(q)) > 1 for q in sample]
    for name, values in samples.items():
        report(f"engine in-process, fresh query embedding, {name}", values)
        report("  one-request queries", [v for v, c in zip(values, chained, strict=True) if not c])
        report("  queries chaining several", [v for v, c in zip(values, chained, strict=True) if c])


def turn(
    snapshot: IndexSnapshot, cached: CachedQueryEmbedder, query: str, config: DiscoveryConfig
) -> None:
    """One turn through the discovery service, as a worker answers it."""
    answer(
        DiscoverRequest(query, tenant=snapshot.tenant),
        Context(snapshot, cached, config, SessionPolicy()),
    )


def load_registry(url: str, caps: list, matrix: np.ndarray, embedder_id: str) -> None:
    client = redis.Redis.from_url(url)
    started = time.perf_counter()
    for index, cap in enumerate(caps):
        event = RegistryEvent(
            type="upsert", tenant=TENANT, capability_id=cap.id, seq=1, capability=cap.to_dict()
        )
        vector = matrix[index].tobytes()
        apply_event(client, event, cap, lambda _c, v=vector: v, vector_space(embedder_id))
    print(
        f"registry stored in Redis: {len(caps)} capabilities in "
        f"{time.perf_counter() - started:.1f} s (vectors precomputed)"
    )


def measure_floors(url: str) -> dict[str, float]:
    floors = {}
    for mode in ("list", "stream"):
        echo = subprocess.Popen([sys.executable, str(HERE / "_echo.py"), mode, url])
        try:
            label = "bare BLPOP/RPUSH" if mode == "list" else "stream + group + reply list"
            floors[mode] = report(f"floor: {label} echo", echo_round_trips(url, mode))
        finally:
            echo.kill()
    return floors


def echo_round_trips(url: str, mode: str, n: int = 2000) -> list[float]:
    client = redis.Redis.from_url(url)
    samples = []
    for index in range(n + 200):
        reply = f"bench:echo:reply:{uuid.uuid4().hex}"
        payload = json.dumps({"reply": reply, "n": index})
        started = time.perf_counter()
        if mode == "list":
            client.rpush("bench:echo:requests", payload)
        else:
            client.xadd("bench:echo:stream", {"payload": payload})
        client.blpop([reply], timeout=5)
        if index >= 200:
            samples.append(time.perf_counter() - started)
    return samples


def spawn_worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CAPDISC_REDIS_URL": url, "CAPDISC_LOG_LEVEL": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "capdisc_workers.discovery"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def through_workers(url: str, queries: list[str], floors: dict[str, float], seconds: float) -> None:
    log = Path(tempfile.gettempdir()) / "capdisc-bench-discovery.log"
    workers = [spawn_worker(url, log)]
    try:
        client = Client.from_url(url, tenant=TENANT, timeout_s=120)
        client.discover("warm up")
        short = single_request_queries()
        fresh, fresh_short = timed(client, queries), timed(client, short)
        cached, cached_short = timed(client, queries), timed(client, short)
        report("one discovery worker, cached query embedding", cached, floors["list"])
        report("  one-request agent turns (registry queries)", cached_short, floors["list"])
        report("one discovery worker, fresh query embedding", fresh, floors["list"])
        report("  one-request agent turns (registry queries)", fresh_short, floors["list"])
        print(
            f"{'':<58} (capdisc transport floor {floors['stream']:.2f} ms, bare floor "
            f"{floors['list']:.2f} ms)"
        )
        workers.append(spawn_worker(url, log))
        Client.from_url(url, tenant=TENANT, timeout_s=120).discover("warm up the second")
        throughput(url, queries, seconds, [w.pid for w in workers], "Seal-Tools queries")
        throughput(url, short, seconds, [w.pid for w in workers], "one-request agent turns")
        second = workers.pop()
        second.terminate()
        second.wait(timeout=10)
        workers[0] = restarted(url, workers[0], log)
        idle_turns(client, queries, short, floors)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=10)


def idle_turns(
    client: Client, queries: list[str], short: list[str], floors: dict[str, float]
) -> None:
    """Turns that reach an idle worker, as an agent's do (one worker, empty caches)."""
    fresh = timed(client, queries[:IDLE_TURNS], IDLE_S)
    fresh_short = timed(client, short, IDLE_S)
    cached_short = timed(client, short, IDLE_S)
    label = f"one worker, turns {IDLE_S * 1000:.0f} ms apart"
    report(f"{label}, fresh, Seal-Tools queries", fresh, floors["list"])
    report("  one-request agent turns, fresh", fresh_short, floors["list"])
    report("  one-request agent turns, cached", cached_short, floors["list"])


def restarted(url: str, worker: subprocess.Popen[bytes], log: Path) -> subprocess.Popen[bytes]:
    """A new worker in place of ``worker``, with the shared query-vector cache emptied: every
    query is fresh again. Returns once it answers."""
    worker.terminate()
    worker.wait(timeout=10)
    connection = redis.Redis.from_url(url)
    for key in connection.scan_iter(match=keys.query_vectors("*"), count=1000):
        connection.delete(key)
    replacement = spawn_worker(url, log)
    Client.from_url(url, tenant=TENANT, timeout_s=120).discover("warm up again")
    return replacement


def timed(client: Client, queries: list[str], idle_s: float = 0.0) -> list[float]:
    samples = []
    for query in queries:
        if idle_s:
            time.sleep(idle_s)  # the agent's think time between turns, not a wait for an event
        started = time.perf_counter()
        client.discover(query)
        samples.append(time.perf_counter() - started)
    return samples


def single_request_queries() -> list[str]:
    """The example registry's labelled queries: one request each, the length of agent turns."""
    with (HERE / "registry_queries.jsonl").open() as handle:
        return [json.loads(line)["query"] for line in handle if line.strip()]


def _client_process(
    url: str, queries: list[str], seconds: float, threads: int, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    stop_at = time.perf_counter() + seconds
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def loop(slot: int) -> None:
        client = Client.from_url(url, tenant=TENANT, timeout_s=30)
        index = slot
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            client.discover(queries[index % len(queries)])
            latencies[slot].append(time.perf_counter() - started)
            counts[slot] += 1
            index += threads

    cpu = sum(os.times()[:2])
    pool = [threading.Thread(target=loop, args=(slot,)) for slot in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    out.put((sum(counts), [x for xs in latencies for x in xs], sum(os.times()[:2]) - cpu))


def throughput(
    url: str,
    queries: list[str],
    seconds: float,
    worker_pids: list[int],
    label: str,
    processes: int = 2,
    threads: int = 8,
) -> None:
    run_clients(url, queries, min(seconds, 5.0), processes, threads)  # warm both workers' caches
    before = sum(_cpu_s(pid) for pid in worker_pids)
    total, latencies, elapsed, client_cpu = run_clients(url, queries, seconds, processes, threads)
    worker_cpu = sum(_cpu_s(pid) for pid in worker_pids) - before
    print(
        f"two discovery workers, cached embeddings, {label}: {total / elapsed:.0f} turns/s "
        f"({processes} client processes x {threads} threads, {elapsed:.1f} s; latency under "
        f"load median {np.median(latencies) * 1000:.1f} ms, p99 "
        f"{percentile([x * 1000 for x in latencies], 99):.1f} ms)"
    )
    print(
        f"{'':<58} CPU per turn: workers {worker_cpu / total * 1000:.2f} ms, clients "
        f"{client_cpu / total * 1000:.2f} ms"
    )


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_clients(
    url: str, queries: list[str], seconds: float, processes: int, threads: int
) -> tuple[int, list[float], float, float]:
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    started = time.perf_counter()
    procs = [
        multiprocessing.Process(target=_client_process, args=(url, queries, seconds, threads, out))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    elapsed = time.perf_counter() - started
    return (
        sum(r[0] for r in results),
        [x for r in results for x in r[1]],
        elapsed,
        sum(r[2] for r in results),
    )


if __name__ == "__main__":
    main()
