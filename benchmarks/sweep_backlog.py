"""What the indexing workers' sweep costs while a full reindex of --size capabilities waits
for the workers, with its batches all queued at once (before) and a window of them (now).

Every ``sweep_interval_s`` (5 s) one indexing worker reads the whole indexing queue and the
outbox to find the tasks the broker lost (:func:`capdisc.registry.outbox.lost`). A full reindex
used to queue all its batches at once: --size / 64 tasks. Now it sends the first
``publish_max_pending_tasks`` (32) and writes the rest to its plan
(:func:`capdisc.registry.reindexstore.begin_reindex`). For each way, in a Redis of its own (no
worker takes the tasks): the bytes the waiting work holds (queue, outbox, plan), and the
sweep's read timed --rounds times while another client PINGs (the probe of
``redis_full_read.py``). Printed: the read's median and p99, the other client's PING (median,
max) beside the floor, and the share of the time spent sweeping every 5 s and with the next
sweep put off until sweeping takes at most ``SWEEP_DUTY``
(:func:`capdisc_workers.reconciling.sweep_pause_s`), computed from the measured read.

    .venv/bin/python benchmarks/sweep_backlog.py [--size 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery

sys.path.insert(0, str(Path(__file__).parent))

from _common import percentile
from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry import outbox
from capdisc.registry.reindexstore import begin_reindex
from capdisc_workers.reconciling import SWEEP_DUTY, sweep_pause_s
from redis_full_read import Probe, floor

INTERVAL_S = 5.0
BATCH = 64
WINDOW = 32
TENANT = "default"


def queue_batches(client: redis.Redis, url: str, size: int) -> int:
    """A full reindex's batch tasks for ``size`` capabilities, all sent at once as the start
    task sent them before; how many."""
    app = Celery(broker=url)
    batches = (size + BATCH - 1) // BATCH
    for number in range(batches):
        ids = [tool_id(number * BATCH + i) for i in range(BATCH)]
        outbox.send(client, app, keys.TASK_REINDEX_BATCH, [TENANT, "job-01", number, ids])
    return batches


def queue_window(client: redis.Redis, url: str, size: int) -> int:
    """The same reindex begun as the start task begins it now (the tenant's ``size`` ids
    stored first, with stand-in records): the first ``WINDOW`` batches sent, the rest in the
    plan; how many tasks were sent."""
    for start in range(0, size, 10_000):
        chunk = range(start, min(size, start + 10_000))
        client.hset(keys.caps(TENANT), mapping={tool_id(n): "{}" for n in chunk})
    app = Celery(broker=url)
    sent = begin_reindex(client, TENANT, "job-01", "space", BATCH, fresh=True, window=WINDOW)
    for number, ids in (sent or {}).items():
        outbox.send(client, app, keys.TASK_REINDEX_BATCH, [TENANT, "job-01", number, ids])
    client.unlink(keys.caps(TENANT))  # what is measured is the waiting work, not the records
    return len(sent or {})


def tool_id(number: int) -> str:
    return f"tool:some-server__some_tool_{number}"


@dataclass
class Run:
    tasks: int
    held_mb: float
    took: list[float]
    pings: list[float]
    max_pings: list[float]
    base: dict[str, float]


def measure(size: int, rounds: int, queue: Callable[[redis.Redis, str, int], int]) -> Run:
    took, pings, max_pings = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        server = start_redis(Path(directory), durable=False)
        try:
            client = redis.Redis.from_url(server.url, socket_timeout=120)
            tasks = queue(client, server.url, size)
            waiting = (keys.INDEXING_QUEUE, keys.OUTBOX, keys.reindex_plan(TENANT, "job-01"))
            held_mb = sum(int(client.memory_usage(k, samples=0) or 0) for k in waiting) / 1e6
            for _round in range(rounds):
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
    return Run(tasks, held_mb, took, pings, max_pings, base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.size:,} capabilities reindexing, {args.rounds} rounds each way")
    before = measure(args.size, args.rounds, queue_batches)
    report("every batch queued at once (before)", before)
    now = measure(args.size, args.rounds, queue_window)
    report(f"a window of {WINDOW} batches, the rest in the plan (now)", now)
    print(
        f"now against before: waiting work {now.held_mb / before.held_mb:.3f} x, the sweep's "
        f"read {statistics.median(now.took) / statistics.median(before.took):.3f} x"
    )


def report(title: str, run: Run) -> None:
    median_s = statistics.median(run.took)
    every = median_s / INTERVAL_S
    put_off = median_s / sweep_pause_s(INTERVAL_S, median_s)
    print(
        f"{title}: {run.tasks:,} batch tasks waiting; queue, outbox and plan hold "
        f"{run.held_mb:.1f} MB"
    )
    p99_ms = percentile(sorted(run.took), 99) * 1000
    print(f"  the sweep's read: median {median_s * 1000:.1f} ms, p99 {p99_ms:.1f} ms")
    print(
        f"  another client's PING during it: median {statistics.median(run.pings):.3f} ms, max "
        f"{statistics.median(run.max_pings):.1f} ms (floor: median "
        f"{run.base['ping_p50_ms']:.3f} ms, max {run.base['ping_max_ms']:.1f} ms)"
    )
    print(
        f"  share of the time sweeping every {INTERVAL_S:g} s: {every:.1%}; put off to keep "
        f"{SWEEP_DUTY:.0%}: {put_off:.1%}, the next sweep "
        f"{sweep_pause_s(INTERVAL_S, median_s):.1f} s after"
    )


if __name__ == "__main__":
    main()
