"""A tenant's records are counted by kind and source as they are written, so that status
reads the counts instead of every record; a registry written before that is counted once, and
only if no record changed meanwhile. Real Redis."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis

from capdisc import keys
from capdisc.models import Capability, SourceRef
from capdisc.registry import counts
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_event

from .conftest import INDEXING_ARGV, publish
from .private import PrivateStack, copy_registry
from .test_cli import run_cli


def _vec(_capability: Capability) -> bytes:
    return np.ones(4, dtype=np.float32).tobytes()


def _upsert(
    connection: redis.Redis, tenant: str, name: str, kind: str, source: str, seq: int
) -> None:
    cap = Capability(
        id=f"{kind}:{name}",
        kind=kind,  # type: ignore[arg-type]
        name=name,
        description=f"{name} does things",
        source_ref=SourceRef(type="manifest", source=source),
    )
    event = RegistryEvent("upsert", tenant, cap.id, seq, capability=cap.to_dict(), take_over=True)
    apply_event(connection, event, cap, _vec, "space")


def _delete(connection: redis.Redis, tenant: str, cap_id: str, source: str, seq: int) -> None:
    event = RegistryEvent("delete", tenant, cap_id, seq, source=source)
    assert apply_event(connection, event, None, _vec, "space").decision == "delete"


def _same(kept: counts.RecordCounts | None, read: counts.RecordCounts) -> bool:
    return kept is not None and (kept.kinds, kept.sources, kept.unreadable) == (
        read.kinds,
        read.sources,
        read.unreadable,
    )


def test_the_counts_follow_every_write_of_a_new_tenant(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    _upsert(connection, tenant, "b", "tool", "dir1", 2)
    _upsert(connection, tenant, "c", "skill", "dir2", 3)
    _upsert(connection, tenant, "b", "tool", "dir2", 4)  # taken over by another source
    _delete(connection, tenant, "tool:a", "dir1", 5)

    kept = counts.kept(connection, tenant)
    read = counts.read(connection, tenant)

    assert read.kinds == {"tool": 1, "skill": 1} and read.sources == {"dir2": 2}
    assert _same(kept, read)


def test_a_tenant_counted_before_counts_were_kept_is_counted_once_then_kept_exact(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    _upsert(connection, tenant, "b", "channel", "dir1", 2)
    connection.delete(keys.record_counts(tenant))  # as a registry written before them
    assert counts.kept(connection, tenant) is None

    recounted = counts.recount(connection, tenant)
    _upsert(connection, tenant, "c", "tool", "dir1", 3)

    assert recounted is not None and recounted.kinds == {"tool": 1, "channel": 1}
    assert _same(counts.kept(connection, tenant), counts.read(connection, tenant))


def test_a_recount_that_a_write_cuts_short_stores_nothing(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    connection.delete(keys.record_counts(tenant))

    def read_while_written(client: Any, name: str) -> counts.RecordCounts:
        found = counts.read(client, name)
        _upsert(connection, tenant, "b", "tool", "dir1", 2)  # a worker writes meanwhile
        return found

    recounted = counts.recount(connection, tenant, read_while_written)

    assert recounted is None
    assert not connection.exists(keys.record_counts(tenant))


def test_a_value_written_outside_capdisc_makes_the_counts_disagree_until_counted_again(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    connection.hset(keys.caps(tenant), "tool:broken", "not a record")

    before = counts.kept(connection, tenant)
    counts.recount(connection, tenant)
    after = counts.kept(connection, tenant)

    assert before is None  # the counts do not add up to the records
    assert after is not None and (after.kinds, after.unreadable) == ({"tool": 1}, 1)


def test_the_reconciler_counts_a_registry_written_before_counts_then_prunes_emptied_ones(
    tmp_path: Path,
) -> None:
    tenant = "counted"
    with PrivateStack(tmp_path / "stack", durable=False) as private:
        private.spawn("indexing", [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"])
        report = publish(private.url, copy_registry(tmp_path / "registry"), tenant, wait_s=90)
        assert report.complete
        connection = private.connection()
        scanned = json.loads(run_cli("status", "--json", env=private.env).stdout)
        connection.delete(keys.record_counts(tenant))  # as a registry written before them

        reconciled = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        connection.hset(keys.record_counts(tenant), "source:long-gone", 0)
        again = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        shown = json.loads(run_cli("status", "--json", env=private.env).stdout)
        kept = counts.kept(connection, tenant)
        pruned = not connection.hexists(keys.record_counts(tenant), "source:long-gone")

    stored = len(report.plan.upserts)
    assert reconciled["records_counted"] == {tenant: stored} and again["records_counted"] == {}
    assert kept is not None and sum(kept.kinds.values()) == stored and pruned
    mine = ("capabilities", "by_kind", "sources", "unreadable_records")
    assert {k: shown["tenants"][tenant][k] for k in mine} == {
        k: scanned["tenants"][tenant][k] for k in mine
    }


def test_a_damaged_count_is_read_as_none_kept_and_counted_again(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    connection.hset(keys.record_counts(tenant), "kind:tool", "not a number")

    damaged = counts.kept(connection, tenant)
    recounted = counts.recount(connection, tenant)

    assert damaged is None
    assert recounted is not None and _same(counts.kept(connection, tenant), recounted)


def test_a_write_over_a_damaged_count_is_made_and_drops_the_counts(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "dir1", 1)
    connection.hset(keys.record_counts(tenant), "kind:tool", "not a number")

    _upsert(connection, tenant, "b", "tool", "dir1", 2)

    assert connection.hexists(keys.caps(tenant), "tool:b")
    assert not connection.exists(keys.record_counts(tenant))
    recounted = counts.recount(connection, tenant)
    assert recounted is not None and recounted.kinds == {"tool": 2}


def test_counts_of_another_type_are_read_as_none_and_writes_go_on(
    connection: redis.Redis, tenant: str
) -> None:
    connection.set(keys.record_counts(tenant), "not a hash")

    _upsert(connection, tenant, "a", "tool", "dir1", 1)

    assert connection.hexists(keys.caps(tenant), "tool:a")
    assert counts.kept(connection, tenant) is None
    recounted = counts.recount(connection, tenant)
    assert recounted is not None and _same(counts.kept(connection, tenant), recounted)


def test_a_count_down_to_zero_is_pruned_unless_a_write_raised_it_again(
    connection: redis.Redis, tenant: str
) -> None:
    _upsert(connection, tenant, "a", "tool", "gone", 1)
    _upsert(connection, tenant, "b", "skill", "back", 2)
    _delete(connection, tenant, "tool:a", "gone", 3)
    _delete(connection, tenant, "skill:b", "back", 4)
    emptied = counts.kept(connection, tenant)
    _upsert(connection, tenant, "c", "skill", "back", 5)  # after the read, before the prune

    assert emptied is not None
    pruned = counts.prune(connection, tenant, emptied.emptied)

    held = connection.hgetall(keys.record_counts(tenant))
    assert pruned == 2 and {b"kind:tool", b"source:gone"}.isdisjoint(held)
    assert _same(counts.kept(connection, tenant), counts.read(connection, tenant))
