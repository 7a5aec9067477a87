"""What ``capdisc status`` costs on a large tenant: its time and the memory of the process
that runs it.

Fills a Redis of its own with --size capabilities (the records and vectors of
``redis_full_read.py``) and runs, each in a fresh process, alternating, --rounds times:

- ``floor``: the tenant's records scanned (HSCAN, 256 fields a command) and dropped, unparsed;
- ``whole``: every record held, then parsed and counted, as status did first;
- ``pieces``: every record read, each piece parsed, counted and dropped
  (:func:`capdisc.registry.counts.read`), as status did before the counts were kept (the
  baseline, measured in the same run);
- ``status``: :func:`capdisc.status.collect_status` as it is: the counts kept beside the
  records (stored once here as the reconciler stores them for a registry written before
  them, :func:`capdisc.registry.counts.recount`; the filled records bypass the writers).

Printed per way: the time (median) and the process's peak RSS above its RSS before the call.

    .venv/bin/python benchmarks/status_scale.py [--size 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.forkserver
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).parent))

from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry import counts
from capdisc.registry.policy import stored_record
from capdisc.registry.store import scan_hash
from capdisc.status import collect_status
from redis_full_read import TENANT, fill


def floor(client: redis.Redis) -> int:
    cursor, fields = 0, 0
    while True:
        cursor, part = client.hscan(keys.caps(TENANT), cursor, count=256)
        fields += len(part)
        if cursor == 0:
            return fields


def whole(client: redis.Redis) -> int:
    stored = {k: stored_record(v) for k, v in scan_hash(client, keys.caps(TENANT)).items()}
    records = [r for r in stored.values() if r is not None and r.readable]
    return sum(Counter(r.capability["kind"] for r in records).values())


def pieces(client: redis.Redis) -> int:
    return sum(counts.read(client, TENANT).kinds.values())


def status(client: redis.Redis) -> int:
    return int(collect_status(client)["tenants"][TENANT]["capabilities"])


WAYS = {"floor": floor, "whole": whole, "pieces": pieces, "status": status}


def run(url: str, way: str, out: multiprocessing.Queue[tuple[float, float, int]]) -> None:
    client = redis.Redis.from_url(url, socket_timeout=120)
    client.ping()
    before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    count = WAYS[way](client)
    took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KB on Linux
    out.put((took, (peak - before) / 1e6, count))


#: Each way runs in a process of the fork server, started before the tenant is filled: a
#: process's peak RSS (ru_maxrss) carries over a fork and an exec, so a child of this process
#: after the fill would start with its peak (129 MB at a million) and hide a way's own rise.
CONTEXT = multiprocessing.get_context("forkserver")


def measure(url: str, way: str) -> tuple[float, float, int]:
    context = CONTEXT
    out: multiprocessing.Queue[tuple[float, float, int]] = context.Queue()
    process = context.Process(target=run, args=(url, way, out))
    process.start()
    result = out.get(timeout=600)
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float, int]]] = {way: [] for way in WAYS}
    multiprocessing.forkserver.ensure_running()  # before the fill (CONTEXT)
    with tempfile.TemporaryDirectory() as directory:
        server = start_redis(Path(directory), durable=False)
        try:
            filler = redis.Redis.from_url(server.url, socket_timeout=600)
            fill(filler, args.size)
            if counts.recount(filler, TENANT) is None:
                raise SystemExit("the records changed while they were counted: nothing should")
            for _round in range(args.rounds):
                for way in WAYS:
                    runs[way].append(measure(server.url, way))
        finally:
            server.stop()
    print(f"{args.size:,} capabilities; medians of {args.rounds} rounds, each in a new process")
    print("way        time (s)   peak RSS rise (MB)   counted")
    medians = {}
    for way, results in runs.items():
        took = statistics.median(r[0] for r in results)
        rise = statistics.median(r[1] for r in results)
        medians[way] = (took, rise)
        print(f"{way:8} {took:10.3f} {rise:20.0f} {results[0][2]:9,}")
    (base_s, base_mb), (new_s, new_mb) = medians["pieces"], medians["status"]
    floor_s = medians["floor"][0]
    print(
        f"status against pieces: time {new_s / base_s:.4f} x, peak RSS rise {new_mb:.0f} against "
        f"{base_mb:.0f} MB; status against the bare scan: {new_s / floor_s:.4f} x its time"
    )


if __name__ == "__main__":
    main()
