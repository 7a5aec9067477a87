"""Indexing heals in seconds with every setting at its default: the tasks a killed indexing
worker held run again on another, and an import rides out a Redis restart and reports what was
applied. Each test runs on a Redis and workers of its own (the workers' environment is the
default one: no test speedups on the healing path)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.registry.store import tenant_version

from .private import PrivateStack, private_on_defaults, write_catalog

private = private_on_defaults

TENANT = "heal"
TOOLS = 1500
#: The target: converged this long after the fault, at most.
CONVERGE_S = 60.0


def start_import(private: PrivateStack, catalog: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "capdisc_producers.cli",
        "import",
        "jsonl",
        str(catalog),
        "--tenant",
        TENANT,
        "--timeout",
        "120",
    ]
    return private.spawn("import", argv)


def await_condition(check: object, limit_s: float, what: str) -> float:
    """Poll ``check()`` until true; seconds it took. Fails the test after ``limit_s``."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            if check():  # type: ignore[operator]
                return time.monotonic() - started
        except redis.ConnectionError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{what} did not happen within {limit_s:.0f} s")


def stored(connection: redis.Redis) -> int:
    return int(connection.hlen(keys.caps(TENANT)))


def test_the_tasks_of_a_killed_indexing_worker_run_again_within_a_minute(
    private: PrivateStack, tmp_path: Path
) -> None:
    connection = private.connection()
    first = private.spawn_indexing("indexing-1")
    importer = start_import(private, write_catalog(tmp_path / "tools.jsonl", TOOLS, "heal"))
    await_condition(
        lambda: (
            tenant_version(connection, TENANT) > 100 and connection.hlen(keys.KOMBU_UNACKED) > 0
        ),
        60,
        "a task in flight",
    )

    first.send_signal(signal.SIGKILL)
    first.wait()
    killed = time.monotonic()
    private.spawn_indexing("indexing-2")

    took = await_condition(lambda: stored(connection) == TOOLS, CONVERGE_S, "convergence")
    assert importer.wait(timeout=120) == 0
    assert time.monotonic() - killed >= took
    # no task is left behind: a task's message is acknowledged when it returns, which can be
    # after its last event's acknowledgement reached the importer (a redelivered task of
    # duplicates still runs), so this is awaited, not asserted at once
    await_condition(
        lambda: connection.hlen(keys.KOMBU_UNACKED) == 0, CONVERGE_S, "every task acknowledged"
    )


def test_an_import_rides_out_a_redis_restart_and_reports_everything_applied(
    private: PrivateStack, tmp_path: Path
) -> None:
    private.spawn_indexing()
    importer = start_import(private, write_catalog(tmp_path / "tools.jsonl", TOOLS, "heal"))
    connection = private.connection()
    await_condition(lambda: tenant_version(connection, TENANT) > 100, 60, "an import under way")

    private.stop_redis()
    time.sleep(2.0)  # the outage itself: how long Redis stays away
    private.start_redis(lose_data=False)

    await_condition(lambda: stored(private.connection()) == TOOLS, CONVERGE_S, "convergence")
    assert importer.wait(timeout=120) == 0
    output = (private.log_dir / "import.log").read_text()
    assert "redis unavailable" in output and "resumed after 1 Redis outage" in output
    assert "applied; " in output


def test_a_full_reindex_whose_indexing_worker_is_killed_swaps_in_on_another(
    private: PrivateStack, tmp_path: Path
) -> None:
    """A reindex of more batches than its window (64 batches, 32 sent at the start): the
    worker building it is SIGKILLed after its first batch, whatever it held then (a batch, or
    a successor recorded and not yet sent), and another one finishes it."""
    from capdisc_producers.publisher import Publisher
    from capdisc_producers.reindex import start_full_reindex

    tools = 64 * 64
    connection = private.connection()
    first = private.spawn_indexing("indexing-1")
    importer = start_import(private, write_catalog(tmp_path / "tools.jsonl", tools, "heal"))
    assert importer.wait(timeout=120) == 0
    imported = tenant_version(connection, TENANT)
    publisher = Publisher(private.url)
    job, _after = start_full_reindex(connection, publisher, TENANT, fresh=True)
    publisher.close()
    built = keys.reindex_done(TENANT, job)
    await_condition(lambda: connection.scard(built) >= 1, 60, "a first batch built")

    first.send_signal(signal.SIGKILL)
    first.wait()
    private.spawn_indexing("indexing-2")

    await_condition(
        lambda: not connection.exists(keys.reindex(TENANT), built),
        CONVERGE_S,
        "the swap",
    )
    space = connection.get(keys.space(TENANT))
    assert space is not None and tenant_version(connection, TENANT) == imported + 1  # swapped
    assert connection.get(keys.reindex_failed(TENANT, job)) is None
    assert connection.hlen(keys.vectors(TENANT, space.decode())) == tools
    assert not connection.exists(keys.reindex_plan(TENANT, job))
