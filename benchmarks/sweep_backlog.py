"""What the indexing workers' sweep costs while thousands of tasks wait, and how far putting it
off keeps that down.

Every ``sweep_interval_s`` (5 s) one indexing worker reads the whole indexing queue and the
outbox to find the tasks the broker lost (:func:`capdisc.registry.outbox.lost`). A full reindex
queues all its batches at once: --size capabilities are --size / 64 tasks. This benchmark sends
them (no worker takes them) to a Redis of its own and times that read, --rounds times, while
another client PINGs (the probe of ``redis_full_read.py``). Printed: the read's median and
p99, the other client's PING (median, max) beside the floor, and the share of the time spent
sweeping at the interval (as before) and with the next sweep put off until sweeping takes at
most ``SWEEP_DUTY`` (now; :func:`capdisc_workers.reconciling.sweep_pause_s`), computed from the
measured read.

    .venv/bin/python benchmarks/sweep_backlog.py [--size 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis
from celery import Celery

sys.path.insert(0, str(Path(__file__).parent))

from _common import percentile
from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry import outbox
from capdisc_workers.reconciling import SWEEP_DUTY, sweep_pause_s
from redis_full_read import Probe, floor

INTERVAL_S = 5.0
BATCH = 64


def queue_batches(client: redis.Redis, url: str, size: int) -> int:
    """A full reindex's batch tasks for ``size`` capabilities, sent as the start task sends
    them; how many."""
    app = Celery(broker=url)
    batches = (size + BATCH - 1) // BATCH
    for number in range(batches):
        ids = [f"tool:some-server__some_tool_{number * BATCH + i}" for i in range(BATCH)]
        outbox.send(client, app, keys.TASK_REINDEX_BATCH, ["default", "job-01", number, ids])
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    took, pings, max_pings = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        server = start_redis(Path(directory), durable=False)
        try:
            client = redis.Redis.from_url(server.url, socket_timeout=120)
            tasks = queue_batches(client, server.url, args.size)
            held_mb = sum(
                int(client.memory_usage(k) or 0) for k in (keys.INDEXING_QUEUE, keys.OUTBOX)
            )
            for _round in range(args.rounds):
                with Probe(server.url) as probe:
                    started = time.perf_counter()
                    found = outbox.lost(client, 0)
                    took.append(time.perf_counter() - started)
                if found:
                    raise SystemExit(f"{len(found)} tasks read as lost: none should be")
                pings.append(statistics.median(probe.pings))
                max_pings.append(max(probe.pings))
            base = floor(server.url)
        finally:
            server.stop()
    report(args, tasks, held_mb / 1e6, took, pings, max_pings, base)


def report(
    args: argparse.Namespace,
    tasks: int,
    held_mb: float,
    took: list[float],
    pings: list[float],
    max_pings: list[float],
    base: dict[str, float],
) -> None:
    median_s = statistics.median(took)
    before = median_s / INTERVAL_S
    after = median_s / sweep_pause_s(INTERVAL_S, median_s)
    print(
        f"{args.size:,} capabilities reindexing: {tasks:,} batch tasks waiting; queue and outbox "
        f"hold {held_mb:.1f} MB"
    )
    p99_ms = percentile(sorted(took), 99) * 1000
    print(
        f"the sweep's read: median {median_s * 1000:.0f} ms, p99 {p99_ms:.0f} ms "
        f"({args.rounds} rounds)"
    )
    print(
        f"another client's PING during it: median {statistics.median(pings):.3f} ms, max "
        f"{statistics.median(max_pings):.1f} ms (floor: median {base['ping_p50_ms']:.3f} ms, "
        f"max {base['ping_max_ms']:.1f} ms)"
    )
    print(
        f"share of the time sweeping every {INTERVAL_S:g} s: {before:.1%} (before); put off to "
        f"keep {SWEEP_DUTY:.0%}: {after:.1%} (now), the next sweep "
        f"{sweep_pause_s(INTERVAL_S, median_s):.1f} s after"
    )


if __name__ == "__main__":
    main()
