"""What a large import's waiting tasks cost Redis's memory, with and without the producer's
bound on tasks waiting for the indexing workers (``publish_max_pending_tasks``).

For each bound (``--bounds``, 0 = none), a fresh embedded stack (its own Redis, one indexing
and one discovery worker, the ``hashing`` embedder unless ``--embedder`` says otherwise)
imports the same ``--size`` synthetic capabilities as ``capdisc import jsonl`` does, waiting
for every ack. Another process samples, every 50 ms, the bytes Redis holds for tasks sent and
not yet applied (``MEMORY USAGE`` of the outbox, the indexing queue and kombu's unacked hash)
and how many tasks the outbox holds. Printed per bound: the import's wall time, those bytes'
peak and the most tasks waiting, and Redis's ``used_memory`` after the import (the registry
itself); then each bounded run against the unbounded one, same run.

    .venv/bin/python benchmarks/import_backlog.py [--size 100000] [--bounds 0,32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import RedisSampler
from capdisc import keys
from capdisc.settings import Settings
from capdisc_producers.importer import import_jsonl
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import running_stack

WORKERS_READY_S = 120.0


def write_catalog(path: Path, size: int) -> Path:
    with path.open("w") as out:
        for number in range(size):
            tool = {
                "id": f"bench-tool-{number}",
                "name": f"bench_tool_{number}",
                "description": f"Tool {number} does one thing for the caller. " * 12,
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "What to do."}},
                },
                "category": f"group-{number % 50}",
            }
            out.write(json.dumps(tool) + "\n")
    return path


def waiting_tasks(client: redis.Redis) -> tuple[int, int]:
    """The bytes Redis holds for tasks sent and not yet applied, and how many the outbox holds."""
    held = sum(
        int(client.memory_usage(key, samples=0) or 0)
        for key in (keys.OUTBOX, keys.INDEXING_QUEUE, keys.KOMBU_UNACKED)
    )
    return held, int(client.hlen(keys.OUTBOX))


def run(catalog: Path, size: int, bound: int, embedder: str, timeout_s: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "CAPDISC_REDIS_URL"}
    env.update(CAPDISC_EMBEDDER=embedder, CAPDISC_PUBLISH_MAX_PENDING_TASKS=str(bound))
    settings = Settings.load(env)
    with (
        tempfile.TemporaryDirectory(prefix="capdisc-backlog-") as project,
        running_stack(Path(project), settings, env) as (stack, url),
    ):
        client = redis.Redis.from_url(url)
        stack.wait_for_workers(client, {"indexing", "discovery"}, WORKERS_READY_S)
        publisher = Publisher(url, max_pending_tasks=settings.publish_max_pending_tasks)
        try:
            with RedisSampler(url, waiting_tasks, 0.05) as probe:
                started = time.perf_counter()
                report = import_jsonl(
                    client, publisher, catalog, tenant=settings.tenant, wait_s=timeout_s
                )
                wall_s = time.perf_counter() - started
        finally:
            publisher.close()
        after = int(client.info("memory")["used_memory"])
    if not report.complete or len(report.outcomes) != size:
        raise SystemExit(f"bound {bound}: {len(report.outcomes)} of {size} events applied")
    return {
        "bound": bound,
        "wall_s": wall_s,
        "waiting_peak_mb": max(held for held, _tasks in probe.samples) / 1e6,
        "waiting_tasks_peak": max(tasks for _held, tasks in probe.samples),
        "after_mb": after / 1e6,
    }


def main() -> None:
    args = bound_arguments(__doc__)
    bounds = [int(b) for b in args.bounds.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        catalog = write_catalog(Path(directory) / "tools.jsonl", args.size)
        results = [run(catalog, args.size, b, args.embedder, args.timeout) for b in bounds]
    print(f"{args.size:,} capabilities imported ({args.embedder} embedder), a fresh stack each")
    print("bound (tasks)    import    tasks waiting: peak bytes / most   used_memory after")
    for r in results:
        print(
            f"{r['bound'] or 'none':>13}  {r['wall_s']:7.1f} s   {r['waiting_peak_mb']:10.1f} MB / "
            f"{r['waiting_tasks_peak']:4d}        {r['after_mb']:7.0f} MB"
        )
    against_none(results, "waiting tasks' peak", "import time")


def bound_arguments(doc: str | None) -> argparse.Namespace:
    """--size, --bounds (0: none), --embedder, --timeout: what a run per bound needs."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--bounds", default="0,32")
    parser.add_argument("--embedder", default="hashing")
    parser.add_argument("--timeout", type=float, default=3600.0)
    return parser.parse_args()


def against_none(results: list[dict[str, Any]], peak: str, time_name: str) -> None:
    """Each bounded run's peak and wall time against the unbounded run's (bound 0), if any."""
    for r, unbounded in bounded_pairs(results):
        print(
            f"bound {r['bound']} against none: {peak} "
            f"{r['waiting_peak_mb']:.1f} against {unbounded['waiting_peak_mb']:.1f} MB "
            f"({r['waiting_peak_mb'] / unbounded['waiting_peak_mb']:.2f} x), {time_name} "
            f"{r['wall_s'] / unbounded['wall_s']:.2f} x"
        )


def bounded_pairs(results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each bounded run with the unbounded one (bound 0); none when there was no such run."""
    unbounded = next((r for r in results if r["bound"] == 0), None)
    return [(r, unbounded) for r in results if unbounded is not None and r is not unbounded]


if __name__ == "__main__":
    main()
