"""An indexing worker rides out a Redis restart on its own: the task it was running when Redis
went away runs again once Redis is back (applying is idempotent), the deliveries whose
acknowledgement went nowhere are given back by the sweep, and the registry converges to the
source with no producer waiting (nothing re-sent by an importer), every setting at its default.
The worker stays the same process and says once that Redis went and once that it came back."""

from __future__ import annotations

from pathlib import Path

import redis

from capdisc import keys
from capdisc.registry.store import tenant_version
from capdisc_producers.importer import import_jsonl
from capdisc_producers.publisher import Publisher

from .private import PrivateStack, private_on_defaults, wait_for, write_catalog

private = private_on_defaults

TENANT = "outage"
TOOLS = 3000
#: The target: the registry equals the source this long after Redis is back, at most.
CONVERGE_S = 60.0


def stored(stack: PrivateStack) -> int:
    try:
        return int(stack.connection().hlen(keys.caps(TENANT)))
    except redis.ConnectionError:
        return -1


def test_an_indexing_worker_finishes_the_queue_across_a_redis_restart_with_no_producer_waiting(
    private: PrivateStack, tmp_path: Path
) -> None:
    worker = private.spawn_indexing()
    publisher = Publisher(private.url)
    try:  # sent and not waited for: only the worker and its sweep can finish the work
        source = write_catalog(tmp_path / "tools.jsonl", TOOLS, "out")
        report = import_jsonl(private.connection(), publisher, source, tenant=TENANT, wait_s=0)
    finally:
        publisher.close()
    assert report.sent == TOOLS
    connection = private.connection()
    wait_for(lambda: tenant_version(connection, TENANT) > 300, 60, "indexing under way")

    private.stop_redis()
    try:
        wait_for(
            lambda: private.events("indexing", "redis_unavailable"),
            20,
            "the worker noticing Redis is gone",
        )
    except AssertionError as exc:  # seen once in CI: the worker's own account of those 20 s
        raise AssertionError(
            f"{exc}; the worker's log ends:\n{private.log_tail('indexing')}"
        ) from exc
    private.start_redis(lose_data=False)

    wait_for(lambda: stored(private) == TOOLS, CONVERGE_S, "the registry equal to the source")
    wait_for(lambda: private.events("indexing", "redis_reconnected"), 20, "reconnected log")
    after = private.connection()
    wait_for(
        lambda: (
            after.hlen(keys.OUTBOX) == 0
            and after.hlen(keys.KOMBU_UNACKED) == 0
            and after.llen(keys.INDEXING_QUEUE) == 0
        ),
        30,
        "nothing left in flight",
    )
    assert worker.poll() is None and private.processes["indexing"].pid == worker.pid
    assert len(private.events("indexing", "redis_unavailable")) == 1
    assert len(private.events("indexing", "redis_reconnected")) == 1
    assert not private.events("indexing", "heartbeat_failed")
