"""The registry in Redis: stored records, tombstones, vectors, index versions and change records.

Writers (indexing workers) apply one event at a time under optimistic locking (WATCH on the
tenant's records, tombstones and version), so the record, the vector, the version bump and the
change record land together or not at all. Readers (discovery workers, producers, status) read
consistent snapshots in one MULTI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from capdisc import keys
from capdisc.embedding import Matrix
from capdisc.events import RegistryEvent
from capdisc.models import Capability
from capdisc.registry import Decision, StoredRecord, decide

#: Approximate length the changes stream is trimmed to (discovery workers reload a full snapshot
#: when they find a gap, so trimming never loses state, only deltas).
CHANGES_MAXLEN = 100_000
ACK_TTL_S = 3600

Redis = redis.Redis


@dataclass(frozen=True)
class Outcome:
    """What applying one event did."""

    event_id: str
    capability_id: str
    decision: Decision
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "capability_id": self.capability_id,
                "decision": self.decision, "version": self.version}


@dataclass(frozen=True)
class Snapshot:
    """A consistent read of one tenant: its version, records and vectors, and the id of the last
    change record at that moment (where following the changes stream resumes)."""

    tenant: str
    version: int
    records: dict[str, StoredRecord]
    vectors: dict[str, bytes]
    changes_id: str


def apply_event(
    client: Redis,
    event: RegistryEvent,
    capability: Capability | None,
    vector_for: Callable[[Capability], bytes],
    embedder_id: str,
) -> Outcome:
    """Apply one decoded event atomically; ``vector_for`` runs only when an embedding is needed."""
    tenant, cap_id = event.tenant, event.capability_id
    watched = (keys.caps(tenant), keys.tombstones(tenant), keys.version(tenant))
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(*watched)  # type: ignore[no-untyped-call]
                stored = _read_record(pipe, tenant, cap_id)
                tomb = pipe.hget(keys.tombstones(tenant), cap_id)
                version = int(pipe.get(keys.version(tenant)) or 0)
                content_hash = capability.content_hash if capability else None
                has_vector = bool(pipe.hexists(keys.vectors(tenant, embedder_id), cap_id))
                decision = decide(event, stored, int(tomb) if tomb else None, content_hash,
                                  has_vector)
                vector = vector_for(capability) if decision == "upsert" and capability else None
                pipe.multi()
                version = _write(pipe, event, capability, decision, version, vector, embedder_id)
                pipe.execute()
                return Outcome(event.event_id, cap_id, decision, version)
            except redis.WatchError:
                continue


def needing_vectors(client: Redis, pending: list[tuple[RegistryEvent, Capability | None]],
                    embedder_id: str) -> list[Capability]:
    """The capabilities among ``pending`` events that applying them now would embed: one read
    of every record, tombstone and vector, so a batch embeds in one model call and nothing that
    is stale, a duplicate or unchanged is embedded. :func:`apply_event` still decides for itself
    under its lock; this is only a forecast (a race costs at most an extra embedding)."""
    upserts = [(e, c) for e, c in pending if e.type == "upsert" and c is not None]
    if not upserts:
        return []
    with client.pipeline(transaction=False) as pipe:
        for event, _capability in upserts:
            pipe.hget(keys.caps(event.tenant), event.capability_id)
            pipe.hget(keys.tombstones(event.tenant), event.capability_id)
            pipe.hexists(keys.vectors(event.tenant, embedder_id), event.capability_id)
        raw = pipe.execute()
    needed = []
    for index, (event, capability) in enumerate(upserts):
        record, tomb, has_vector = raw[3 * index:3 * index + 3]
        stored = StoredRecord.from_dict(json.loads(record)) if record else None
        if decide(event, stored, int(tomb) if tomb else None, capability.content_hash,
                  bool(has_vector)) == "upsert":
            needed.append(capability)
    return needed


def _write(
    pipe: Any,
    event: RegistryEvent,
    capability: Capability | None,
    decision: Decision,
    version: int,
    vector: bytes | None,
    embedder_id: str,
) -> int:
    tenant, cap_id = event.tenant, event.capability_id
    pipe.sadd(keys.TENANTS, tenant)
    if decision in ("delete", "absent"):
        pipe.hset(keys.tombstones(tenant), cap_id, event.seq)
    if decision == "unchanged" and capability is not None:
        record = StoredRecord(capability.to_dict(), event.seq, capability.content_hash,
                              event.occurred_at_ms)
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(record.to_dict()))
    if decision not in ("upsert", "delete"):
        return version
    version += 1
    if decision == "upsert" and capability is not None and vector is not None:
        record = StoredRecord(capability.to_dict(), event.seq, capability.content_hash,
                              int(time.time() * 1000))
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(record.to_dict()))
        pipe.hset(keys.vectors(tenant, embedder_id), cap_id, vector)
        pipe.hdel(keys.tombstones(tenant), cap_id)
    else:
        pipe.hdel(keys.caps(tenant), cap_id)
        pipe.hdel(keys.vectors(tenant, embedder_id), cap_id)
    pipe.set(keys.version(tenant), version)
    pipe.xadd(keys.CHANGES, {"tenant": tenant, "version": version, "op": decision, "id": cap_id},
              maxlen=CHANGES_MAXLEN, approximate=True)
    return version


def _read_record(client: Any, tenant: str, cap_id: str) -> StoredRecord | None:
    raw = client.hget(keys.caps(tenant), cap_id)
    return StoredRecord.from_dict(json.loads(raw)) if raw else None


def record_ack(client: Redis, batch_id: str, outcome: dict[str, Any]) -> None:
    """Tell whoever waits on a publish batch that one of its events is done."""
    with client.pipeline(transaction=False) as pipe:
        pipe.rpush(keys.acks(batch_id), json.dumps(outcome))
        pipe.expire(keys.acks(batch_id), ACK_TTL_S)
        pipe.execute()


def dead_letter(client: Redis, payload: str | bytes, reason: str, attempts: int = 1) -> None:
    """Keep an event that could not be applied, with the reason, for ``capdisc dlq``."""
    text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
    client.xadd(keys.DEADLETTERS, {"payload": text[:1_048_576], "reason": reason,
                                   "attempts": attempts, "at_ms": int(time.time() * 1000)})


# -- reads -------------------------------------------------------------------------------------


def read_snapshot(client: Redis, tenant: str, embedder_id: str) -> Snapshot:
    """One consistent read of everything a discovery worker needs for ``tenant``."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.version(tenant))
        pipe.hgetall(keys.caps(tenant))
        pipe.hgetall(keys.vectors(tenant, embedder_id))
        pipe.xrevrange(keys.CHANGES, count=1)
        version, caps, vectors, last = pipe.execute()
    records = {as_str(k): StoredRecord.from_dict(json.loads(v)) for k, v in caps.items()}
    return Snapshot(tenant=tenant, version=int(version or 0), records=records,
                    vectors={as_str(k): v for k, v in vectors.items()},
                    changes_id=as_str(last[0][0]) if last else "0-0")


def read_records(client: Redis, tenant: str, ids: list[str], embedder_id: str
                 ) -> list[tuple[StoredRecord | None, bytes | None]]:
    """Current record and vector of each id (``None`` where it is gone)."""
    with client.pipeline(transaction=True) as pipe:
        for cap_id in ids:
            pipe.hget(keys.caps(tenant), cap_id)
            pipe.hget(keys.vectors(tenant, embedder_id), cap_id)
        raw = pipe.execute()
    out = []
    for index in range(0, len(raw), 2):
        record = StoredRecord.from_dict(json.loads(raw[index])) if raw[index] else None
        out.append((record, raw[index + 1]))
    return out


def stored_by_source(client: Redis, tenant: str, source: str) -> dict[str, StoredRecord]:
    """The stored records that came from ``source`` (a registry directory, an MCP server)."""
    records = {}
    for key, value in client.hgetall(keys.caps(tenant)).items():
        record = StoredRecord.from_dict(json.loads(value))
        if record.source == source:
            records[as_str(key)] = record
    return records


def tenants(client: Redis) -> list[str]:
    return sorted(as_str(t) for t in client.smembers(keys.TENANTS))


def tenant_version(client: Redis, tenant: str) -> int:
    return int(client.get(keys.version(tenant)) or 0)


def vector_bytes(vector: Matrix) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def as_str(value: Any) -> str:
    """Redis replies are bytes unless decoded; this gives text either way."""
    return value.decode() if isinstance(value, bytes) else str(value)
