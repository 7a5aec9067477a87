"""Ordering, duplicates and tombstones through the real indexing worker: an older event changes
nothing, a duplicate changes nothing, a late upsert cannot resurrect a deleted capability."""

from __future__ import annotations

import json

import redis

from capdisc import keys
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import tenant_version
from capdisc_producers.publisher import Publisher, wait_for_acks

from .conftest import Stack


def _upsert(tenant: str, seq: int, description: str) -> RegistryEvent:
    return RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id="tool:clock",
        seq=seq,
        capability={"kind": "tool", "name": "clock", "description": description},
        batch_id=f"{tenant}-{seq}-{description[:5]}",
    )


def _apply(stack: Stack, connection: redis.Redis, event: RegistryEvent) -> str:
    """Send one event and wait for its outcome; its decision."""
    Publisher(stack.url).send([event])
    outcomes = wait_for_acks(connection, str(event.batch_id), 1, 30, seen=set())
    return str(outcomes[0]["decision"])


def _description(connection: redis.Redis, tenant: str) -> str | None:
    raw = connection.hget(keys.caps(tenant), "tool:clock")
    return json.loads(raw)["capability"]["description"] if raw else None


def test_an_older_event_arriving_after_a_newer_one_changes_nothing(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    decisions = [
        _apply(stack, connection, _upsert(tenant, 10, "Tells the time, new.")),
        _apply(stack, connection, _upsert(tenant, 5, "Tells the time, old.")),
    ]

    assert decisions == ["upsert", "stale"]
    assert _description(connection, tenant) == "Tells the time, new."
    assert tenant_version(connection, tenant) == 1


def test_the_same_event_delivered_twice_changes_nothing_the_second_time(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    event = _upsert(tenant, 7, "Tells the time.")

    decisions = [_apply(stack, connection, event), _apply(stack, connection, event)]

    assert decisions == ["upsert", "stale"]
    assert tenant_version(connection, tenant) == 1


def test_a_late_upsert_after_a_delete_does_not_resurrect_the_capability(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    delete = RegistryEvent(
        type="delete", tenant=tenant, capability_id="tool:clock", seq=3, batch_id=f"{tenant}-delete"
    )
    decisions = [
        _apply(stack, connection, _upsert(tenant, 1, "Tells the time.")),
        _apply(stack, connection, delete),
        _apply(stack, connection, _upsert(tenant, 2, "Tells the time, late.")),
    ]

    assert decisions == ["upsert", "delete", "stale"]
    assert _description(connection, tenant) is None
    assert int(connection.hget(keys.tombstones(tenant), "tool:clock") or 0) == 3
