"""Discovery during a full reindex: no errors and no empty answers while
``capdisc reindex --all`` rebuilds a tenant beside the live index and swaps it in.

Starts the embedded stack (its own Redis, one indexing worker, one discovery worker; the
embedder CAPDISC_EMBEDDER names), imports --size capabilities (Seal-Tools and MetaTool tools
plus generated variants), then runs a full reindex (``--fresh``: every text embedded again)
while a client asks Seal-Tools queries in a loop. Printed: requests answered before, during and
after the swap, errors, empty answers, latency during the reindex, the reindex's wall time.
Target: discovery keeps answering (no errors, no empty answers) throughout.

    CAPDISC_EMBEDDER=hashing .venv/bin/python benchmarks/reindex_availability.py [--size 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog, seal_queries
from _common import describe_ms
from capdisc.client import Client
from capdisc.errors import CapdiscError
from capdisc.registry.policy import SyncPlan
from capdisc.settings import Settings
from capdisc_producers.publisher import Publisher
from capdisc_producers.reindex import start_full_reindex, wait_for_swap
from capdisc_producers.stack import REDIS_ENV, running_stack
from capdisc_producers.sync import publish_plan


class Load:
    """Discovery requests in a loop on a thread: answers, failures, empty answers, times."""

    def __init__(self, client: Client, queries: list[str]) -> None:
        self.client, self.queries = client, queries
        #: What each query found before the reindex: an empty answer counts only for a query
        #: that found something then.
        self.before = {q: bool(client.discover(q).capabilities) for q in queries}
        self.stop = threading.Event()
        self.answers: list[tuple[float, float, int]] = []  # (at, seconds, version)
        self.failures: list[str] = []
        self.empty = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            query = self.queries[turn % len(self.queries)]
            turn += 1
            started = time.perf_counter()
            try:
                answer = self.client.discover(query)
            except CapdiscError as exc:
                self.failures.append(str(exc))
                continue
            self.answers.append((started, time.perf_counter() - started, answer.index_version))
            if not answer.capabilities and self.before[query]:
                self.empty += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != REDIS_ENV}
    settings = Settings.load(env)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_stack(Path(tmp), settings, env) as (stack, url),
    ):
        connection = redis.Redis.from_url(url)
        stack.wait_for_workers(connection, {"indexing", "discovery"}, 120)
        publisher = Publisher(url)
        report = publish_plan(
            connection,
            publisher,
            SyncPlan(upserts=load_catalog(args.size)),
            root=Path("bench"),
            tenant=settings.tenant,
            source="bench",
            wait_s=7200,
        )
        client = Client(connection, tenant=settings.tenant, timeout_s=30)
        client.discover("warm up", min_version=report.index_version)
        print(
            f"embedder {settings.embedder}; {args.size} capabilities at index version "
            f"{report.index_version}"
        )
        load = Load(
            Client(redis.Redis.from_url(url), tenant=settings.tenant, timeout_s=30),
            seal_queries()[:100],
        )
        load.thread.start()
        started = time.perf_counter()
        job, after = start_full_reindex(connection, publisher, settings.tenant, fresh=True)
        swapped = wait_for_swap(connection, settings.tenant, job, after, timeout_s=7200)
        took = time.perf_counter() - started
        client.discover("after the swap", min_version=swapped or 0)
        load.stop.set()
        load.thread.join(timeout=60)
        publisher.close()
    print_report(load, started, took, swapped)


def print_report(load: Load, started: float, took: float, swapped: int | None) -> None:
    during = [s for at, s, _v in load.answers if started <= at <= started + took]
    versions = sorted({v for _at, _s, v in load.answers})
    print(f"full reindex (--fresh) swapped in at version {swapped} after {took:.1f} s")
    print(
        f"answers: {len(load.answers)} in all, {len(during)} during the reindex; versions "
        f"served {versions[0]}..{versions[-1]}"
    )
    if during:
        print(f"latency during the reindex: {describe_ms(during)}")
    print(
        f"errors {len(load.failures)}, empty answers to queries that found something before "
        f"the reindex {load.empty}"
    )
    for failure in load.failures[:5]:
        print(f"  {failure}")
    ok = swapped is not None and not load.failures and not load.empty and bool(during)
    print(
        f"target: discovery keeps answering (no errors, no empty answers) throughout a full "
        f"reindex: {'MET' if ok else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
