"""What a full reindex's waiting batches cost Redis's memory: every batch sent at the start
(``publish_max_pending_tasks`` 0, as before) against a window of them, each built batch sending
the next of its lane (32, the default).

For each bound (``--bounds``), a fresh embedded stack (its own Redis, one indexing and one
discovery worker, the ``hashing`` embedder unless ``--embedder`` says otherwise) imports the same
``--size`` synthetic capabilities (``import_backlog.py``'s catalog, 32 import tasks waiting at
most), then runs ``capdisc reindex --all --fresh`` through to its swap. Another process samples,
every 50 ms, the bytes Redis holds for the reindex's waiting work: ``MEMORY USAGE`` of the
outbox, the indexing queue, kombu's unacked hash and the reindex's plan of batches not sent
yet, and how many tasks the outbox holds. Printed per bound: the reindex's wall time (start to
swap), those bytes' peak, the most tasks waiting; then each bound against none, same run.

    .venv/bin/python benchmarks/reindex_backlog.py [--size 100000] [--bounds 0,32]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import RedisSampler
from capdisc import keys
from capdisc.settings import Settings
from capdisc_producers.importer import import_jsonl
from capdisc_producers.publisher import Publisher
from capdisc_producers.reindex import start_full_reindex, wait_for_swap
from capdisc_producers.stack import running_stack
from import_backlog import (
    WORKERS_READY_S,
    against_none,
    bound_arguments,
    waiting_tasks,
    write_catalog,
)

IMPORT_BOUND = 32


def waiting_work(client: redis.Redis) -> tuple[int, int]:
    """The bytes Redis holds for tasks sent and not yet applied plus a reindex's plan, and how
    many tasks the outbox holds."""
    held, tasks = waiting_tasks(client)
    plans = client.scan_iter(match=keys.reindex_plan("*", "*"), count=1000)
    return held + sum(int(client.memory_usage(p, samples=0) or 0) for p in plans), tasks


@contextmanager
def imported_stack(
    catalog: Path, size: int, env_set: dict[str, str], timeout_s: float
) -> Iterator[tuple[str, redis.Redis, Publisher, Settings]]:
    """A fresh embedded stack (``env_set`` over this environment) that imported ``catalog``
    (``size`` capabilities, at most ``IMPORT_BOUND`` import tasks waiting): its URL, a client,
    a publisher and its settings."""
    env = {k: v for k, v in os.environ.items() if k != "CAPDISC_REDIS_URL"}
    env.update(env_set)
    settings = Settings.load(env)
    with (
        tempfile.TemporaryDirectory(prefix="capdisc-bench-") as project,
        running_stack(Path(project), settings, env) as (stack, url),
    ):
        client = redis.Redis.from_url(url, socket_timeout=120)
        stack.wait_for_workers(client, {"indexing", "discovery"}, WORKERS_READY_S)
        publisher = Publisher(url, max_pending_tasks=IMPORT_BOUND)
        try:
            report = import_jsonl(
                client, publisher, catalog, tenant=settings.tenant, wait_s=timeout_s
            )
            if not report.complete or len(report.outcomes) != size:
                raise SystemExit(f"{len(report.outcomes)} of {size} imported")
            yield url, client, publisher, settings
        finally:
            publisher.close()


def full_reindex(
    client: redis.Redis, publisher: Publisher, tenant: str, timeout_s: float
) -> tuple[int | None, float]:
    """``capdisc reindex --all --fresh`` of ``tenant``, start to swap: the version swapped in
    (None: it did not swap in time) and the seconds it took."""
    started = time.perf_counter()
    job, after = start_full_reindex(client, publisher, tenant, fresh=True)
    version = wait_for_swap(client, tenant, job, after, timeout_s=timeout_s)
    return version, time.perf_counter() - started


def run(catalog: Path, size: int, bound: int, embedder: str, timeout_s: float) -> dict[str, Any]:
    env = {"CAPDISC_EMBEDDER": embedder, "CAPDISC_PUBLISH_MAX_PENDING_TASKS": str(bound)}
    with imported_stack(catalog, size, env, timeout_s) as (url, client, publisher, settings):
        tenant = settings.tenant
        with RedisSampler(url, waiting_work, 0.05) as probe:
            version, wall_s = full_reindex(client, publisher, tenant, timeout_s)
        space = client.get(keys.space(tenant))
        vectors = int(client.hlen(keys.vectors(tenant, space.decode()))) if space else 0
    if version is None or vectors != size:
        raise SystemExit(f"bound {bound}: swapped {version}, {vectors} of {size} vectors")
    return {
        "bound": bound,
        "wall_s": wall_s,
        "waiting_peak_mb": max(held for held, _tasks in probe.samples) / 1e6,
        "waiting_tasks_peak": max(tasks for _held, tasks in probe.samples),
    }


def main() -> None:
    args = bound_arguments(__doc__)
    bounds = [int(b) for b in args.bounds.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        catalog = write_catalog(Path(directory) / "tools.jsonl", args.size)
        results = [run(catalog, args.size, b, args.embedder, args.timeout) for b in bounds]
    print(
        f"full reindex of {args.size:,} capabilities ({args.embedder} embedder), a fresh stack each"
    )
    print("bound (tasks)   reindex    waiting work: peak bytes / most tasks")
    for r in results:
        print(
            f"{r['bound'] or 'none':>13}  {r['wall_s']:7.1f} s   {r['waiting_peak_mb']:10.1f} MB / "
            f"{r['waiting_tasks_peak']:5d}"
        )
    against_none(results, "waiting work's peak", "reindex time")


if __name__ == "__main__":
    main()
