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
from .test_cli import run_cli


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


def test_reconcile_forgets_tombstones_past_the_horizon_and_keeps_recent_ones(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    def delete(cap_id: str, seq: int) -> RegistryEvent:
        return RegistryEvent(
            type="delete", tenant=tenant, capability_id=cap_id, seq=seq, batch_id=f"d-{cap_id}"
        )

    _apply(stack, connection, _upsert(tenant, 1, "Tells the time."))
    _apply(stack, connection, delete("tool:clock", 3))
    _apply(stack, connection, delete("tool:renamed-long-ago", 3))
    connection.zadd(keys.tombstone_times(tenant), {"tool:renamed-long-ago": 1})  # long ago
    connection.hset(keys.tombstones(tenant), "tool:untimed", 3)  # written before times were

    report = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)

    assert set(connection.hkeys(keys.tombstones(tenant))) == {b"tool:clock", b"tool:untimed"}
    assert report["tombstones_pruned"] >= 1
    assert connection.zscore(keys.tombstone_times(tenant), "tool:untimed")
    assert _apply(stack, connection, _upsert(tenant, 2, "Tells the time, late.")) == "stale"
    assert _description(connection, tenant) is None
    assert _apply(stack, connection, _upsert(tenant, 4, "Tells the time, again.")) == "upsert"
    assert connection.zscore(keys.tombstone_times(tenant), "tool:clock") is None
