"""A discovery worker's full read of a tenant is scanned in small pieces while writers go on:
the read, with the changes after it applied as a worker applies them, is exactly the registry."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis

from capdisc import keys
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import (
    Snapshot,
    apply_events,
    read_delta,
    read_snapshot,
    scan_hash,
)

SPACE = "space"
CATALOG = 300


def _upsert(tenant: str, number: int, seq: int, words: str = "") -> RegistryEvent:
    capability = Capability(
        id=f"tool:t{number}", kind="tool", name=f"t{number}", description=f"Tool {number}. {words}"
    )
    return RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id=capability.id,
        seq=seq,
        capability={**capability.to_dict(), "source_ref": {"source": "files"}},
    )


def _delete(tenant: str, number: int, seq: int) -> RegistryEvent:
    return RegistryEvent(
        type="delete", tenant=tenant, capability_id=f"tool:t{number}", seq=seq, source="files"
    )


def _vector(capability: Capability) -> bytes:
    seed = sum(capability.description.encode())
    return np.random.default_rng(seed).random(4, dtype=np.float32).tobytes()


def _apply(connection: redis.Redis, events: list[RegistryEvent]) -> None:
    items = [(e, Capability.from_dict(e.capability) if e.capability else None) for e in events]
    apply_events(connection, items, _vector, SPACE)


def _writes(tenant: str) -> list[RegistryEvent]:
    """Edits, deletes and new capabilities across the whole catalog, in that order per id."""
    events: list[RegistryEvent] = []
    for number in range(0, CATALOG, 7):
        events.append(_upsert(tenant, number, 2, "Edited."))
    for number in range(3, CATALOG, 11):
        events.append(_delete(tenant, number, 3))
    for number in range(CATALOG, CATALOG + 40):
        events.append(_upsert(tenant, number, 1))
    return events


def _made_current(connection: redis.Redis, snap: Snapshot) -> dict[str, tuple[str, bytes]]:
    """``snap`` with the tenant's changes after it applied as a discovery worker applies them:
    each changed id read again (:func:`read_delta`)."""
    served = {
        cap_id: (record.content_hash, snap.vectors[cap_id])
        for cap_id, record in snap.records.items()
        if cap_id in snap.vectors
    }
    changed = [
        fields[b"id"].decode()
        for _id, fields in connection.xrange(keys.CHANGES, min=f"({snap.changes_id}")
        if fields[b"tenant"].decode() == snap.tenant and int(fields[b"version"]) > snap.version
    ]
    ids = list(dict.fromkeys(changed))
    delta = read_delta(connection, snap.tenant, ids, SPACE)
    for cap_id, (record, vector) in zip(ids, delta.entries, strict=True):
        if record is None or vector is None:
            served.pop(cap_id, None)
        else:
            served[cap_id] = (record.content_hash, vector)
    return served


def _registry(connection: redis.Redis, tenant: str) -> dict[str, tuple[str, bytes]]:
    snap = read_snapshot(connection, tenant, SPACE)
    return {cap_id: (r.content_hash, snap.vectors[cap_id]) for cap_id, r in snap.records.items()}


@pytest.mark.parametrize("round_", range(3))
def test_a_read_scanned_while_writers_go_on_is_made_current_by_the_changes_after_it(
    connection: redis.Redis, tenant: str, round_: int
) -> None:
    _apply(connection, [_upsert(tenant, n, 1) for n in range(CATALOG)])
    writes, writing = _writes(tenant), threading.Event()

    def write() -> None:
        for start in range(0, len(writes), 3):
            _apply(connection, writes[start : start + 3])
            writing.set()

    writer = threading.Thread(target=write)
    writer.start()
    writing.wait(10)
    snap = read_snapshot(connection, tenant, SPACE, count=8 + round_)
    writer.join()

    assert _made_current(connection, snap) == _registry(connection, tenant)
    assert len(_registry(connection, tenant)) == CATALOG - len(range(3, CATALOG, 11)) + 40


def test_a_full_read_in_many_pieces_holds_every_record_and_vector(
    connection: redis.Redis, tenant: str
) -> None:
    _apply(connection, [_upsert(tenant, n, 1) for n in range(CATALOG)])

    snap = read_snapshot(connection, tenant, SPACE, count=16)

    assert set(snap.records) == set(snap.vectors) == {f"tool:t{n}" for n in range(CATALOG)}
    assert snap.version == CATALOG
    assert scan_hash(connection, keys.caps(tenant), 16) == connection.hgetall(keys.caps(tenant))
