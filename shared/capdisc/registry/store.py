"""The registry in Redis: stored records, tombstones, vectors, index versions and change records.

Writers (indexing workers) apply one event at a time under optimistic locking (WATCH on the
tenant's records, tombstones and version), so the record, the vector, its tool-poisoning flag
(:mod:`capdisc.registry.flags`, scanned as it is written), the version bump, the change record
and the acknowledgement to a waiting publisher land together or not at all. Readers (discovery
workers, producers, status) read consistent snapshots in one MULTI.

A full reindex's staging and swap are :mod:`capdisc.registry.reindexstore`, the repair of
records and vectors that drifted apart is :mod:`capdisc.registry.drift`, and events that could
not be applied go to :mod:`capdisc.registry.deadletters`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from capdisc import keys
from capdisc.embedders.port import Matrix
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.events import RegistryEvent
from capdisc.registry.flags import Flag, rescanned
from capdisc.registry.policy import Decision, StoredRecord, decide, ownership_note, parsed_records

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
    #: Why a ``refused_owned`` event was refused (its owner, what to do), or whom a take-over
    #: took the capability from (:func:`capdisc.registry.policy.ownership_note`).
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "event_id": self.event_id,
            "capability_id": self.capability_id,
            "decision": self.decision,
            "version": self.version,
        }
        if self.reason:
            fields["reason"] = self.reason
        return fields


@dataclass(frozen=True)
class Snapshot:
    """A consistent read of one tenant: its version, records and the vectors of the space it is
    served from, and the id of the last change record at that moment (where following the
    changes stream resumes)."""

    tenant: str
    version: int
    records: dict[str, StoredRecord]
    vectors: dict[str, bytes]
    changes_id: str
    space: str = ""
    #: Tool-poisoning flags by capability id (only flagged ones) and the tenant's own policy
    #: (None: the workers' ``poisoning_policy``), read in the same transaction.
    flags: dict[str, Flag] = field(default_factory=dict)
    policy: str | None = None


@dataclass(frozen=True)
class Delta:
    """A consistent read of some capabilities of one tenant: record and vector of each id
    (None where gone), the flags of those flagged, and the tenant's own policy."""

    entries: list[tuple[StoredRecord | None, bytes | None]]
    flags: dict[str, Flag]
    policy: str | None


@dataclass(frozen=True)
class Spaces:
    """Where one writer's vectors go for one tenant: its ``own`` vector space (its embedder's),
    the ``active`` space discovery serves, and the ``staging`` space of a full reindex that is
    building ``own`` (so a change made during the build is in the new index too)."""

    own: str
    active: str
    staging: str | None = None

    def write_targets(self) -> list[str]:
        return [self.own] + ([self.staging] if self.staging else [])

    def delete_targets(self) -> list[str]:
        return list(dict.fromkeys([self.own, self.active, *self.write_targets()]))


def apply_event(
    client: Redis,
    event: RegistryEvent,
    capability: Capability | None,
    vector_for: Callable[[Capability], bytes],
    space: str,
    *,
    acknowledge: bool = True,
) -> Outcome:
    """Apply one decoded event atomically; ``vector_for`` runs only when an embedding is needed.
    ``space`` is the writer's vector space; a reindex event re-embeds the stored capability.
    The outcome of an event of a publish batch is acknowledged in the same transaction, so a
    worker killed right after the write cannot leave the producer with a wrong outcome; unless
    not ``acknowledge`` (the caller acknowledges it once the change is written elsewhere too,
    :func:`record_acks`)."""
    tenant, cap_id = event.tenant, event.capability_id
    watched = (
        keys.caps(tenant),
        keys.tombstones(tenant),
        keys.version(tenant),
        keys.space(tenant),
        keys.reindex(tenant),
        keys.flags(tenant),
    )
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(*watched)  # type: ignore[no-untyped-call]
                stored = _read_record(pipe, tenant, cap_id)
                if event.type == "reindex" and stored is not None:
                    capability = Capability.from_dict(stored.capability)
                tomb = pipe.hget(keys.tombstones(tenant), cap_id)
                version = int(pipe.get(keys.version(tenant)) or 0)
                spaces = read_spaces(pipe, tenant, space)
                content_hash = capability.content_hash if capability else None
                has_vector = bool(pipe.hexists(keys.vectors(tenant, space), cap_id))
                decision = decide(
                    event, stored, int(tomb) if tomb else None, content_hash, has_vector
                )
                vector = (
                    vector_for(capability)
                    if decision in ("upsert", "reindex") and capability
                    else None
                )
                flag = _rescan(pipe, tenant, cap_id, capability) if vector else None
                pipe.multi()
                version = _write(pipe, event, capability, decision, version, vector, spaces, stored)
                _queue_flag(pipe, tenant, cap_id, decision, flag)
                outcome = Outcome(
                    event.event_id,
                    cap_id,
                    decision,
                    version,
                    ownership_note(event, decision, stored),
                )
                if event.batch_id and acknowledge:
                    _queue_ack(pipe, event.batch_id, outcome.to_dict())
                pipe.execute()
                return outcome
            except redis.WatchError:
                continue


def _rescan(pipe: Any, tenant: str, cap_id: str, capability: Capability | None) -> Flag | None:
    """The tool-poisoning flag of ``capability`` as it is about to be stored: scanned now, its
    previous flag's approval carried over (:func:`capdisc.registry.flags.rescanned`). An unreadable
    previous flag counts as none (its approval is lost: it is reviewed again)."""
    if capability is None:
        return None
    raw = pipe.hget(keys.flags(tenant), cap_id)
    try:
        previous = Flag.from_json(raw) if raw else None
    except (ValueError, KeyError, TypeError):
        previous = None
    return rescanned(capability, previous)


def _queue_flag(pipe: Any, tenant: str, cap_id: str, decision: Decision, flag: Flag | None) -> None:
    """Keep the flag beside the record an upsert or reindex writes (while the scan finds
    something), or drop it with the record a delete removes."""
    if decision in ("upsert", "reindex") and flag is not None:
        pipe.hset(keys.flags(tenant), cap_id, flag.to_json())
    elif decision in ("upsert", "reindex", "delete"):
        pipe.hdel(keys.flags(tenant), cap_id)


def read_spaces(client: Any, tenant: str, own: str) -> Spaces:
    """The :class:`Spaces` of a writer whose vector space is ``own``."""
    active = client.get(keys.space(tenant))
    marker = client.hgetall(keys.reindex(tenant))
    build = {as_str(k): as_str(v) for k, v in marker.items()}
    staging = keys.staging_space(own, build["job"]) if build.get("target") == own else None
    return Spaces(own, as_str(active) if active else own, staging)


def needing_vectors(
    client: Redis, pending: list[tuple[RegistryEvent, Capability | None]], space: str
) -> list[Capability]:
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
            pipe.hexists(keys.vectors(event.tenant, space), event.capability_id)
        raw = pipe.execute()
    needed = []
    for index, (event, capability) in enumerate(upserts):
        record, tomb, has_vector = raw[3 * index : 3 * index + 3]
        stored = StoredRecord.from_dict(json.loads(record)) if record else None
        if (
            decide(
                event,
                stored,
                int(tomb) if tomb else None,
                capability.content_hash,
                bool(has_vector),
            )
            == "upsert"
        ):
            needed.append(capability)
    return needed


def _write(
    pipe: Any,
    event: RegistryEvent,
    capability: Capability | None,
    decision: Decision,
    version: int,
    vector: bytes | None,
    spaces: Spaces,
    stored: StoredRecord | None,
) -> int:
    tenant, cap_id = event.tenant, event.capability_id
    pipe.sadd(keys.TENANTS, tenant)
    if decision in ("delete", "absent"):
        pipe.hset(keys.tombstones(tenant), cap_id, event.seq)
    if decision == "unchanged" and capability is not None:
        record = StoredRecord(
            capability.to_dict(), event.seq, capability.content_hash, event.occurred_at_ms
        )
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(record.to_dict()))
        _index_source(pipe, tenant, cap_id, stored, record)
    if decision not in ("upsert", "delete", "reindex"):
        return version
    version += 1
    if decision in ("upsert", "reindex") and capability is not None and vector is not None:
        seq = stored.seq if decision == "reindex" and stored else event.seq
        record = StoredRecord(
            capability.to_dict(), seq, capability.content_hash, int(time.time() * 1000)
        )
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(record.to_dict()))
        _index_source(pipe, tenant, cap_id, stored, record)
        for space in spaces.write_targets():
            pipe.hset(keys.vectors(tenant, space), cap_id, vector)
        pipe.setnx(keys.space(tenant), spaces.own)
        pipe.hdel(keys.tombstones(tenant), cap_id)
    else:
        pipe.hdel(keys.caps(tenant), cap_id)
        _index_source(pipe, tenant, cap_id, stored, None)
        for space in spaces.delete_targets():
            pipe.hdel(keys.vectors(tenant, space), cap_id)
    pipe.set(keys.version(tenant), version)
    op = "upsert" if decision == "reindex" else decision
    pipe.xadd(
        keys.CHANGES,
        {"tenant": tenant, "version": version, "op": op, "id": cap_id},
        maxlen=CHANGES_MAXLEN,
        approximate=True,
    )
    return version


def _index_source(
    pipe: Any, tenant: str, cap_id: str, old: StoredRecord | None, new: StoredRecord | None
) -> None:
    """Keep the per-source id sets (:func:`stored_by_source` reads one, not every record)."""
    if old is not None and (new is None or old.source != new.source):
        pipe.srem(keys.source_ids(tenant, old.source), cap_id)
    if new is not None:
        pipe.sadd(keys.source_ids(tenant, new.source), cap_id)


def _read_record(client: Any, tenant: str, cap_id: str) -> StoredRecord | None:
    raw = client.hget(keys.caps(tenant), cap_id)
    return StoredRecord.from_dict(json.loads(raw)) if raw else None


def record_ack(client: Redis, batch_id: str, outcome: dict[str, Any]) -> None:
    """Tell whoever waits on a publish batch that one of its events is done."""
    with client.pipeline(transaction=False) as pipe:
        _queue_ack(pipe, batch_id, outcome)
        pipe.execute()


def record_acks(client: Redis, acks: list[tuple[str, dict[str, Any]]]) -> None:
    """:func:`record_ack` of each ``(batch id, outcome)``, in one round trip."""
    if not acks:
        return
    with client.pipeline(transaction=False) as pipe:
        for batch_id, outcome in acks:
            _queue_ack(pipe, batch_id, outcome)
        pipe.execute()


def _queue_ack(pipe: Any, batch_id: str, outcome: dict[str, Any]) -> None:
    pipe.rpush(keys.acks(batch_id), json.dumps(outcome))
    pipe.expire(keys.acks(batch_id), ACK_TTL_S)


# -- reads -------------------------------------------------------------------------------------


def read_snapshot(client: Redis, tenant: str, default_space: str) -> Snapshot:
    """One consistent read of everything a discovery worker needs for ``tenant``, from the
    vector space it is served from (``default_space`` until a writer has set one)."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.space(tenant))  # type: ignore[no-untyped-call]
                active = pipe.get(keys.space(tenant))
                space = as_str(active) if active else default_space
                pipe.multi()
                pipe.get(keys.version(tenant))
                pipe.hgetall(keys.caps(tenant))
                pipe.hgetall(keys.vectors(tenant, space))
                pipe.xrevrange(keys.CHANGES, count=1)
                pipe.hgetall(keys.flags(tenant))
                pipe.get(keys.poisoning_policy(tenant))
                version, caps, vectors, last, flags, policy = pipe.execute()
                break
            except redis.WatchError:
                continue
    parsed = parsed_records(caps.values())
    records = {as_str(k): StoredRecord.from_dict(v) for k, v in zip(caps, parsed, strict=True)}
    return Snapshot(
        tenant=tenant,
        version=int(version or 0),
        records=records,
        vectors={as_str(k): v for k, v in vectors.items()},
        changes_id=as_str(last[0][0]) if last else "0-0",
        space=space,
        flags={as_str(k): Flag.from_json(v) for k, v in flags.items()},
        policy=as_str(policy) if policy is not None else None,
    )


def read_records(
    client: Redis, tenant: str, ids: list[str], embedder_id: str
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


def read_delta(client: Redis, tenant: str, ids: list[str], space: str) -> Delta:
    """What :func:`read_records` reads, with the flags of those ids and the tenant's policy, in
    one transaction (a flag is never paired with another version of its record)."""
    if not ids:
        return Delta([], {}, None)
    with client.pipeline(transaction=True) as pipe:
        for cap_id in ids:
            pipe.hget(keys.caps(tenant), cap_id)
            pipe.hget(keys.vectors(tenant, space), cap_id)
        pipe.hmget(keys.flags(tenant), ids)
        pipe.get(keys.poisoning_policy(tenant))
        *raw, flags, policy = pipe.execute()
    entries = [
        (StoredRecord.from_dict(json.loads(raw[i])) if raw[i] else None, raw[i + 1])
        for i in range(0, len(raw), 2)
    ]
    return Delta(
        entries,
        {cap_id: Flag.from_json(v) for cap_id, v in zip(ids, flags, strict=True) if v},
        as_str(policy) if policy is not None else None,
    )


def stored_by_source(client: Redis, tenant: str, source: str) -> dict[str, StoredRecord]:
    """The stored records that came from ``source`` (a registry directory, an MCP server)."""
    ids = sorted(as_str(i) for i in client.smembers(keys.source_ids(tenant, source)))
    records = {}
    for cap_id, value in zip(ids, client.hmget(keys.caps(tenant), ids) if ids else [], strict=True):
        record = StoredRecord.from_dict(json.loads(value)) if value else None
        if record is not None and record.source == source:
            records[cap_id] = record
    return records


def owners(client: Redis, tenant: str, ids: Iterable[str], chunk: int = 1000) -> dict[str, str]:
    """The source each stored one of ``ids`` belongs to (its record's ``source_ref.source``,
    empty for a record stored without one); ids not stored are left out."""
    wanted = sorted(set(ids))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), chunk):
        part = wanted[start : start + chunk]
        for cap_id, raw in zip(part, client.hmget(keys.caps(tenant), part), strict=True):
            if raw:
                found[cap_id] = StoredRecord.from_dict(json.loads(raw)).source
    return found


def tenants(client: Redis) -> list[str]:
    return sorted(as_str(t) for t in client.smembers(keys.TENANTS))


def tenant_version(client: Redis, tenant: str) -> int:
    return int(client.get(keys.version(tenant)) or 0)


def vector_bytes(vector: Matrix) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()
