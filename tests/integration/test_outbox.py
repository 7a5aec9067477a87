"""No event is lost between the broker and a worker: tasks are recorded in the outbox, a lost
one is sent again by the reconciler, and a waiting producer counts each event once."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry import outbox
from capdisc.registry.events import RegistryEvent
from capdisc_producers.publisher import Publisher, wait_for_acks

from .conftest import Stack
from .test_cli import run_cli


def _upsert(tenant: str, name: str, batch_id: str) -> RegistryEvent:
    cap = Capability(
        id=f"tool:{name}",
        kind="tool",
        name=name,
        description=f"The {name} tool does {name} things.",
    )
    return RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id=cap.id,
        seq=time.time_ns(),
        capability=cap.to_dict(),
        batch_id=batch_id,
    )


def test_a_task_the_broker_lost_is_sent_again(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    """The worker's own sweep (every few seconds) and ``capdisc reconcile`` both re-send it;
    whichever comes first counts it, so the test reads the shared counter, not one report."""
    resent_before = int(connection.hget(keys.COUNTERS, "tasks_resent") or 0)
    batch_id = uuid.uuid4().hex
    payload = _upsert(tenant, "lost", batch_id).encode()
    lost_id = uuid.uuid4().hex  # recorded, never reached the queue (a worker died mid-pop)
    connection.hset(
        keys.OUTBOX,
        lost_id,
        json.dumps(
            {
                "name": keys.TASK_APPLY_EVENTS,
                "args": [[payload]],
                "kwargs": {},
                "sent_at_ms": int(time.time() * 1000) - 60_000,
            }
        ),
    )

    run_cli("reconcile", "--json", env=stack.env)
    outcomes = wait_for_acks(connection, batch_id, 1, timeout_s=30)

    assert int(connection.hget(keys.COUNTERS, "tasks_resent") or 0) > resent_before
    assert [o["decision"] for o in outcomes] == ["upsert"]
    assert connection.hexists(keys.caps(tenant), "tool:lost")


def test_a_done_task_leaves_the_outbox(stack: Stack, tenant: str, connection: redis.Redis) -> None:
    publisher = Publisher(stack.url)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    first_task = outbox.send(
        connection,
        publisher.app,
        keys.TASK_APPLY_EVENTS,
        [[_upsert(tenant, "one", first).encode()]],
    )
    outbox.send(
        connection,
        publisher.app,
        keys.TASK_APPLY_EVENTS,
        [[_upsert(tenant, "two", second).encode()]],
    )

    wait_for_acks(connection, second, 1, timeout_s=30)  # one solo worker: the first is done
    publisher.close()

    assert not connection.hexists(keys.OUTBOX, first_task)


def test_a_redelivered_event_is_counted_once_with_its_first_outcome(
    connection: redis.Redis,
) -> None:
    batch_id = uuid.uuid4().hex
    for decision in ("upsert", "stale"):  # applied, killed before the ack, redelivered
        connection.rpush(
            keys.acks(batch_id),
            json.dumps({"event_id": "e1", "capability_id": "tool:a", "decision": decision}),
        )
    connection.rpush(
        keys.acks(batch_id),
        json.dumps({"event_id": "e2", "capability_id": "tool:b", "decision": "delete"}),
    )

    outcomes = wait_for_acks(connection, batch_id, 2, timeout_s=5)

    assert [(o["event_id"], o["decision"]) for o in outcomes] == [
        ("e1", "upsert"),
        ("e2", "delete"),
    ]


def test_a_waiting_producer_takes_waiting_acks_together_but_no_more_than_asked(
    connection: redis.Redis,
) -> None:
    batch_id = f"b-{uuid.uuid4().hex}"
    for n in range(6):
        connection.rpush(
            keys.acks(batch_id),
            json.dumps({"event_id": f"e{n}", "capability_id": f"tool:{n}", "decision": "upsert"}),
        )
    connection.rpush(  # a redelivered event's second ack
        keys.acks(batch_id),
        json.dumps({"event_id": "e0", "capability_id": "tool:0", "decision": "stale"}),
    )
    seen: set[str] = set()

    first = wait_for_acks(connection, batch_id, 4, timeout_s=5, seen=seen)

    assert [o["event_id"] for o in first] == ["e0", "e1", "e2", "e3"]
    assert connection.llen(keys.acks(batch_id)) == 3  # left for the next call
    rest = wait_for_acks(connection, batch_id, 2, timeout_s=5, seen=seen)
    assert [o["event_id"] for o in rest] == ["e4", "e5"]
    assert connection.llen(keys.acks(batch_id)) == 1  # the duplicate was not needed


@pytest.fixture
def bare_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis of this test's own, with no worker sweeping it."""
    server = start_redis(tmp_path / "redis", durable=False)
    try:
        yield server.url
    finally:
        server.stop()


class _FinishesAfterFirstRead(redis.Redis):
    """A connection on which, right after the first command it sends, a worker finishes task
    ``finishing`` as a real one does: the task leaves the outbox, then its delivery is
    acknowledged."""

    finishing = ""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        if self.finishing:
            task_id, self.finishing = self.finishing, ""
            outbox.done(self, task_id)
            self.hdel(keys.KOMBU_UNACKED, task_id)
        return result


def test_a_task_that_finishes_while_the_sweep_looks_is_not_sent_again(bare_redis: str) -> None:
    """Whichever read of the sweep the task finishes after, it is not taken for lost: sent
    again, it ran twice, and on a busy queue hundreds of tasks a minute did."""
    client = _FinishesAfterFirstRead.from_url(bare_redis)
    task_id, now_ms = uuid.uuid4().hex, 1_000_000
    entry = {"name": keys.TASK_APPLY_EVENTS, "args": [[]], "kwargs": {}, "sent_at_ms": 1}
    client.hset(keys.OUTBOX, task_id, json.dumps(entry))
    message = {"headers": {"id": task_id}, "body": ""}
    client.hset(keys.KOMBU_UNACKED, task_id, json.dumps([message, "", keys.INDEXING_QUEUE]))
    client.finishing = task_id

    lost = outbox.lost(client, grace_s=10, now_ms=now_ms)

    assert lost == []
    assert not client.hexists(keys.OUTBOX, task_id)  # it did finish meanwhile


def test_a_damaged_outbox_entry_is_dropped_and_the_sweep_goes_on(
    stack: Stack, connection: redis.Redis
) -> None:
    connection.hset(keys.OUTBOX, "damaged-entry", "not a task record")

    result = run_cli("reconcile", "--json", "--timeout", "30", env=stack.env)

    assert result.returncode == 0, result.stderr
    assert not connection.hexists(keys.OUTBOX, "damaged-entry")


def test_a_task_no_worker_takes_for_the_give_up_time_is_dead_lettered_and_not_sent_again(
    stack: Stack, connection: redis.Redis
) -> None:
    from capdisc.redisclock import redis_now_ms

    now_ms, task_id = redis_now_ms(connection), f"unknown-{uuid.uuid4().hex}"
    record = {"name": "capdisc.no_such_task", "args": [], "kwargs": {}}
    connection.hset(
        keys.OUTBOX,
        task_id,
        json.dumps({**record, "sent_at_ms": now_ms - 60_000, "first_sent_at_ms": now_ms - 7.2e6}),
    )

    result = run_cli("reconcile", "--json", env=stack.env)

    assert result.returncode == 0, result.stderr
    assert not connection.hexists(keys.OUTBOX, task_id)
    letters = {as_str(i): f for i, f in connection.xrange(keys.DEADLETTERS) if f.get(b"task_id")}
    given_up = [i for i, f in letters.items() if f[b"task_id"].decode() == task_id]
    assert given_up and b"upgrade" in letters[given_up[0]][b"reason"]
    replay = run_cli("dlq", "replay", given_up[0], env=stack.env)
    assert replay.returncode == 1 and "indexing task given up" in replay.stdout
