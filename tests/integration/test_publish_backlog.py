"""A producer sends its next indexing task only while fewer than its bound of the tasks it sent
wait for the indexing workers: a large import goes at the workers' pace instead of filling
Redis, and nobody else's tasks (a full reindex's batches, another import) hold it up."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.errors import IndexingBacklogError
from capdisc.registry.events import RegistryEvent
from capdisc_producers.publisher import BATCH, Publisher, wait_for_acks

from .conftest import Stack
from .private import PrivateStack
from .test_cli import run_cli


def events(tenant: str, count: int, batch_id: str) -> list[RegistryEvent]:
    return [
        RegistryEvent(
            "upsert",
            tenant,
            f"tool:t{n}",
            1,
            source="backlog",
            capability={"id": f"tool:t{n}", "kind": "tool", "name": f"t{n}", "description": "x"},
            batch_id=batch_id,
        )
        for n in range(count)
    ]


def test_without_indexing_workers_a_producer_sends_up_to_its_bound_then_says_why(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker
        publisher = Publisher(private.url, max_pending_tasks=2, backlog_wait_s=0.3)
        try:
            with pytest.raises(IndexingBacklogError, match="check that an indexing worker runs"):
                publisher.send(events("waits", 5, "b"), batch_size=1)
        finally:
            publisher.close()
        assert private.connection().hlen(keys.OUTBOX) == 2


def test_an_import_that_cannot_send_within_its_timeout_exits_2_saying_what_to_check(
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "tools.jsonl"  # more lines than one task carries: two tasks
    catalog.write_text(
        "".join(
            json.dumps({"id": f"tool{n}", "description": "Weather for a city."}) + "\n"
            for n in range(BATCH + 1)
        )
    )
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker
        env = {**private.env, "CAPDISC_PUBLISH_MAX_PENDING_TASKS": "1"}

        result = run_cli("import", "jsonl", str(catalog), "--timeout", "1", env=env)

        assert private.connection().hlen(keys.OUTBOX) == 1
    assert result.returncode == 2
    assert "1 indexing tasks this command sent still wait" in result.stderr
    assert "check that an indexing worker runs" in result.stderr


def test_another_producers_waiting_tasks_do_not_hold_a_producer_up(tmp_path: Path) -> None:
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker
        other = Publisher(private.url, max_pending_tasks=0)  # a reindex, another import
        other.send(events("earlier", 3, "e"), batch_size=1)
        other.close()
        publisher = Publisher(private.url, max_pending_tasks=2, backlog_wait_s=0.3)
        try:
            sent = publisher.send(events("mine", 2, "m"), batch_size=1)
        finally:
            publisher.close()

        assert sent == 2 and private.connection().hlen(keys.OUTBOX) == 5


def test_with_indexing_workers_every_task_is_sent_and_no_more_than_the_bound_wait(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    seen, done = [], threading.Event()

    def watch_outbox() -> None:
        watcher = redis.Redis.from_url(stack.url)
        while not done.is_set():
            seen.append(int(watcher.hlen(keys.OUTBOX)))

    sampler = threading.Thread(target=watch_outbox)
    sampler.start()
    publisher = Publisher(stack.url, max_pending_tasks=2)
    try:
        sent = publisher.send(events(tenant, 12, "paced"), batch_size=1)
    finally:
        done.set()
        sampler.join()
        publisher.close()

    assert sent == 12
    assert len(wait_for_acks(connection, "paced", 12, 60)) == 12
    assert max(seen) <= 2
