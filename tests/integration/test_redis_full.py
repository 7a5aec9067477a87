"""A full Redis (maxmemory reached; the stack's Redis evicts nothing) held by a real indexing
worker: it waits for Redis to take writes again instead of ending, and then applies the event
it was handed meanwhile."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from capdisc.registry.events import RegistryEvent
from capdisc_producers.publisher import Publisher, wait_for_acks

from .conftest import publish
from .private import PrivateStack, copy_registry, wait_for


def test_an_indexing_worker_holds_a_message_while_redis_is_full(tmp_path: Path) -> None:
    with PrivateStack(tmp_path / "stack", durable=False) as private:
        worker = private.spawn_indexing()
        registry = copy_registry(tmp_path / "reg", lambda p: p.name == "slack-post-message")
        assert publish(private.url, registry, "full", wait_s=90).complete
        connection = private.connection()
        event = RegistryEvent(
            type="upsert",
            tenant="full",
            capability_id="tool:clock",
            seq=1,
            capability={"kind": "tool", "name": "clock", "description": "Tells the time."},
            batch_id="while-full",
        )

        os.kill(worker.pid, signal.SIGSTOP)  # handed the task before Redis fills, read after
        try:
            Publisher(private.url).send([event])
            connection.config_set("maxmemory", 1)  # every write refused (noeviction)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        wait_for(
            lambda: private.events("indexing", "queue_bookkeeping_held"), 30, "the worker holding"
        )
        assert worker.poll() is None, "the indexing worker ended on a full Redis"
        connection.config_set("maxmemory", 0)

        outcomes = wait_for_acks(connection, "while-full", 1, 30)

    assert outcomes[0]["decision"] == "upsert"
