"""What a reconcile run that finds --size records without a vector leaves waiting in Redis,
with its repair sent whole (bound 0, before) and a window at a time (now).

The reconciler sends one reindex event per record without a vector
(:func:`capdisc_workers.reconciling._send_reindexes`), in tasks of 64. Before, a run sent all of
them: after a lost vector hash at a million capabilities, 15,625 tasks held twice (queue and
outbox) until embedded, and read by every sweep. Now at most ``publish_max_pending_tasks``
tasks of them wait; each later run tops the window up. For each bound, in a Redis of its own
(no worker takes the tasks): the run's send time, the bytes queue and outbox hold, and the
sweep's read of them (:func:`capdisc.registry.outbox.lost`, median of --rounds) beside the bare
PING floor of the same Redis.

    .venv/bin/python benchmarks/repair_backlog.py [--size 1000000] [--bounds 0,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry import outbox
from import_backlog import bounded_pairs
from redis_full_read import floor

TENANT = "default"


def measure(url: str, size: int, bound: int, rounds: int) -> dict[str, Any]:
    """One reconcile run's repair of ``size`` records, sent with ``bound`` (0: none)."""
    from capdisc_workers.reconciling import _send_reindexes

    client = redis.Redis.from_url(url, socket_timeout=300)
    client.flushall()
    missing = [f"tool:some-server__some_tool_{n}" for n in range(size)]
    res = SimpleNamespace(redis=client, settings=SimpleNamespace(publish_max_pending_tasks=bound))
    report = {"reindex_sent": 0, "reindex_deferred": 0}
    started = time.perf_counter()
    _send_reindexes(res, TENANT, missing, lambda: {}, report)  # type: ignore[arg-type]
    send_s = time.perf_counter() - started
    held = sum(
        int(client.memory_usage(k, samples=0) or 0) for k in (keys.INDEXING_QUEUE, keys.OUTBOX)
    )
    reads = []
    for _round in range(rounds):
        started = time.perf_counter()
        outbox.lost(client, 0)
        reads.append(time.perf_counter() - started)
    client.close()
    return {
        "bound": bound,
        "sent": report["reindex_sent"],
        "deferred": report["reindex_deferred"],
        "tasks": (report["reindex_sent"] + 63) // 64,
        "send_s": send_s,
        "held_mb": held / 1e6,
        "sweep_read_ms": statistics.median(reads) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--bounds", default="0,32")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = start_redis(Path(directory), durable=False)
        try:
            # the workers' app sends to the Redis its settings name: this one
            os.environ.update(CAPDISC_REDIS_URL=server.url, CAPDISC_EMBEDDER="hashing")
            print(f"a reconcile run finding {args.size:,} records without a vector")
            results = [
                measure(server.url, args.size, int(b), args.rounds) for b in args.bounds.split(",")
            ]
            base = floor(server.url)
        finally:
            server.stop()
    for r in results:
        window = f"{r['bound']} tasks" if r["bound"] else "none"
        print(
            f"bound {r['bound']} ({window}): "
            f"{r['sent']:,} sent in {r['tasks']:,} tasks, {r['deferred']:,} left to later runs; "
            f"the run's send {r['send_s']:.2f} s; queue and outbox hold {r['held_mb']:.1f} MB; "
            f"the sweep's read {r['sweep_read_ms']:.1f} ms median"
        )
    print(f"floor: PING median {base['ping_p50_ms']:.3f} ms")
    for r, unbounded in bounded_pairs(results):
        print(
            f"bound {r['bound']} against none: held {r['held_mb'] / unbounded['held_mb']:.3f}"
            f" x, the sweep's read {r['sweep_read_ms'] / unbounded['sweep_read_ms']:.3f} x"
        )


if __name__ == "__main__":
    main()
