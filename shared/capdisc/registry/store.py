"""The registry in Redis: stored records, tombstones, vectors, index versions and change records.

Writers (indexing workers) apply events under optimistic locking (WATCH on the tenant's
records, tombstones and version), a run of one tenant's events in one transaction, so an
event's record, vector, tool-poisoning flag (:mod:`capdisc.registry.flags`, scanned as it is
written), version bump, change record and acknowledgement to a waiting publisher land together
or not at all. Readers (producers, status) read what they need in one MULTI; a discovery
worker's full read of a tenant (:func:`read_snapshot`) scans it in small pieces instead, so
that no reader holds Redis, or makes it buffer the whole tenant, for the length of one reply.

A full reindex's staging and swap are :mod:`capdisc.registry.reindexstore`, the repair of
records and vectors that drifted apart is :mod:`capdisc.registry.drift`, and events that could
not be applied go to :mod:`capdisc.registry.deadletters`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from capdisc import keys
from capdisc.embedders.port import Matrix
from capdisc.models import Capability
from capdisc.redisclock import redis_now_ms
from capdisc.redisscan import SCAN_COUNT, scan_pieces
from capdisc.redistext import as_str
from capdisc.registry import counts
from capdisc.registry.events import RegistryEvent
from capdisc.registry.flags import Flag, rescanned
from capdisc.registry.policy import (
    Decision,
    StoredRecord,
    decide,
    ownership_note,
    parsed_records,
    stored_record,
)

#: Approximate length the changes stream is trimmed to (discovery workers reload a full snapshot
#: when they find a gap, so trimming never loses state, only deltas).
CHANGES_MAXLEN = 100_000
ACK_TTL_S = 3600
#: The decisions that leave a tombstone.
TOMBSTONING = ("delete", "absent")

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
    """A full read of one tenant: its version, records and the vectors of the space it is
    served from, and the id of the last change record at that version (where following the
    changes stream resumes). Records and vectors were read after that version, so each is that
    version's or newer, never older; applying the changes after ``changes_id`` (each re-reads
    its capability, :func:`read_delta`) makes the whole current."""

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
    #: The ids whose stored value is no record (:data:`~capdisc.registry.policy.UNREADABLE`):
    #: left out of ``records``.
    unreadable: tuple[str, ...] = ()


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


#: Events of one tenant written in one transaction: one round trip to read what they find and
#: one to write them, instead of about ten per event, while a transaction stays short enough
#: not to hold other clients up.
TRANSACTION_EVENTS = 128
#: Concurrent writes a transaction of several events may meet before its events are applied
#: one at a time (each then retried until it lands, as a single event always is).
BATCH_CONFLICTS = 3
VectorFor = Callable[[Capability], bytes]
#: An event to apply and its validated capability (None for a delete or reindex).
Item = tuple[RegistryEvent, Capability | None]


def apply_event(
    client: Redis,
    event: RegistryEvent,
    capability: Capability | None,
    vector_for: VectorFor,
    space: str,
    *,
    acknowledge: bool = True,
) -> Outcome:
    """Apply one decoded event atomically: :func:`apply_events` of that event alone."""
    (outcome,) = apply_events(
        client, [(event, capability)], vector_for, space, acknowledge=acknowledge
    )
    return outcome


def apply_events(
    client: Redis,
    items: Iterable[Item],
    vector_for: VectorFor,
    space: str,
    *,
    acknowledge: bool = True,
) -> list[Outcome]:
    """Apply decoded events in order, each atomically with the others of its transaction:
    consecutive events of one tenant, up to :data:`TRANSACTION_EVENTS`, are read in one round
    trip under WATCH, decided in order (a later event of the same capability finds what an
    earlier one left) and written in one MULTI (:func:`transaction_runs`).

    ``vector_for`` runs only when an embedding is needed. ``space`` is the writer's vector
    space; a reindex event re-embeds the stored capability. The outcome of an event of a
    publish batch is acknowledged in the same transaction, so a worker killed right after the
    write cannot leave the producer with a wrong outcome; unless not ``acknowledge`` (the
    caller acknowledges it once the change is written elsewhere too, :func:`record_acks`)."""
    outcomes: list[Outcome] = []
    for run in transaction_runs(items):
        outcomes += _apply_run(client, run, vector_for, space, acknowledge)
    return outcomes


def transaction_runs(
    items: Iterable[Item],
) -> Iterator[list[Item]]:
    """``items`` cut where :func:`apply_events` starts a new transaction: at a change of tenant
    and every :data:`TRANSACTION_EVENTS` events."""
    run: list[Item] = []
    for item in items:
        if run and (item[0].tenant != run[0][0].tenant or len(run) >= TRANSACTION_EVENTS):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


@dataclass
class _Current:
    """One capability as the next event of a transaction finds it."""

    stored: StoredRecord | None
    tombstone: int | None
    has_vector: bool
    flag: Flag | None


@dataclass(frozen=True)
class _Step:
    """What one event does: its decision, the record before and after it (None: none stored),
    the vector it stores and the flag its capability's scan left."""

    event: RegistryEvent
    decision: Decision
    before: StoredRecord | None
    after: StoredRecord | None
    vector: bytes | None
    flag: Flag | None


def _apply_run(
    client: Redis,
    run: list[Item],
    vector_for: VectorFor,
    space: str,
    acknowledge: bool,
) -> list[Outcome]:
    """One tenant's events in one transaction, again while another writer changes the tenant
    meanwhile; after :data:`BATCH_CONFLICTS` such conflicts, one event at a time."""
    conflicts = 0
    while True:
        try:
            return _transaction(client, run, vector_for, space, acknowledge)
        except redis.WatchError:
            conflicts += 1
            if len(run) > 1 and conflicts >= BATCH_CONFLICTS:
                return [
                    outcome
                    for item in run
                    for outcome in _apply_run(client, [item], vector_for, space, acknowledge)
                ]


def _watched(tenant: str) -> tuple[str, ...]:
    return (
        keys.caps(tenant),
        keys.tombstones(tenant),
        keys.version(tenant),
        keys.space(tenant),
        keys.reindex(tenant),
        keys.flags(tenant),
        keys.record_counts(tenant),
    )


def _transaction(
    client: Redis,
    run: list[Item],
    vector_for: VectorFor,
    space: str,
    acknowledge: bool,
) -> list[Outcome]:
    """Read, decide and write ``run`` (one tenant's events); WatchError if the tenant changed
    between the read and the write. The read goes through another connection after the
    WATCH: whatever changes after the WATCH fails the MULTI, so what was read still holds."""
    tenant = run[0][0].tenant
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(*_watched(tenant))  # type: ignore[no-untyped-call]
        version, spaces, current, counted = _read_current(
            client, tenant, [event.capability_id for event, _ in run], space
        )
        steps = []
        for event, capability in run:
            state = current[event.capability_id]
            step = _step(event, capability, state, vector_for)
            _advance(state, step)
            steps.append(step)
        now_ms = _deleted_at_ms(client, steps)
        pipe.multi()
        outcomes = _queue_steps(pipe, steps, version, spaces, now_ms)
        queued = counts.queue(pipe, tenant, counts.deltas(_written(steps))) if counted else None
        if acknowledge:
            _queue_acks(pipe, [(s.event.batch_id, o) for s, o in zip(steps, outcomes, strict=True)])
        _execute(client, pipe, tenant, queued)
        return outcomes


def _execute(client: Redis, pipe: Any, tenant: str, counting: range | None) -> None:
    """Run the transaction; a failed change of the counts (positions ``counting``) drops them
    (:func:`capdisc.registry.counts.queue`) rather than failing writes that were made."""
    replies = pipe.execute(raise_on_error=False)
    errors = [i for i, reply in enumerate(replies) if isinstance(reply, Exception)]
    if any(counting is None or i not in counting for i in errors):
        _raise_first(replies)
    if counting is not None and errors:
        counts.drop(client, tenant)
        import structlog  # a rare path: command start-up never loads it (capdisc.redisclock)

        structlog.get_logger("capdisc").warning(
            "record_counts_dropped", tenant=tenant, reason=str(replies[errors[0]])
        )


def _raise_first(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _written(steps: list[_Step]) -> Iterator[tuple[StoredRecord | None, StoredRecord | None]]:
    """Each record ``steps`` write, as it was and as it is written (None: deleted), as
    :func:`_write` writes them."""
    for step in steps:
        if step.decision == "unchanged" and step.after is not None:
            yield step.before, step.after
        elif step.decision in ("upsert", "delete", "reindex"):
            stays = step.after is not None and step.vector is not None
            yield step.before, step.after if stays else None


def _deleted_at_ms(client: Redis, steps: list[_Step]) -> int:
    """The time a tombstone written by ``steps`` records (Redis's clock, ms;
    :mod:`capdisc.registry.tombstones`); 0, and no round trip, when they write none."""
    if any(step.decision in TOMBSTONING for step in steps):
        return redis_now_ms(client)
    return 0


def _queue_steps(
    pipe: Any, steps: list[_Step], version: int, spaces: Spaces, now_ms: int
) -> list[Outcome]:
    """Queue the writes of one tenant's ``steps`` (the tenant's version at the start:
    ``version``; a tombstone's time: ``now_ms``); their outcomes. What the whole run shares
    (the tenant's membership, its vector space, its version) is written once."""
    tenant = steps[0].event.tenant
    start, outcomes = version, []
    for step in steps:
        version = _write(pipe, step, version, spaces, now_ms)
        _queue_flag(pipe, tenant, step.event.capability_id, step.decision, step.flag)
        note = ownership_note(step.event, step.decision, step.before)
        outcomes.append(
            Outcome(step.event.event_id, step.event.capability_id, step.decision, version, note)
        )
    pipe.sadd(keys.TENANTS, tenant)
    if any(step.after is not None and step.vector is not None for step in steps):
        pipe.setnx(keys.space(tenant), spaces.own)
    if version != start:
        pipe.set(keys.version(tenant), version)
    return outcomes


def _queue_acks(pipe: Any, acks: list[tuple[str | None, Outcome]]) -> None:
    """Acknowledge each outcome of an event of a publish batch: one push per batch."""
    batches: dict[str, list[str]] = {}
    for batch_id, outcome in acks:
        if batch_id:
            batches.setdefault(batch_id, []).append(json.dumps(outcome.to_dict()))
    for batch_id, values in batches.items():
        pipe.rpush(keys.acks(batch_id), *values)
        pipe.expire(keys.acks(batch_id), ACK_TTL_S)


def _read_current(
    client: Redis, tenant: str, ids: list[str], space: str
) -> tuple[int, Spaces, dict[str, _Current], bool]:
    """The tenant's version and spaces, each of ``ids`` as stored, and whether its records are
    counted (:mod:`capdisc.registry.counts`: complete counts, or no record yet), in one round
    trip."""
    unique = list(dict.fromkeys(ids))
    with client.pipeline(transaction=False) as reads:
        reads.get(keys.version(tenant))
        reads.get(keys.space(tenant))
        reads.hgetall(keys.reindex(tenant))
        reads.hmget(keys.caps(tenant), unique)
        reads.hmget(keys.tombstones(tenant), unique)
        reads.hmget(keys.flags(tenant), unique)
        counted_at = len(reads)  # its reply's position
        reads.hexists(keys.record_counts(tenant), counts.COMPLETE)
        reads.exists(keys.caps(tenant))
        for cap_id in unique:
            reads.hexists(keys.vectors(tenant, space), cap_id)
        replies = reads.execute(raise_on_error=False)
    if isinstance(replies[counted_at], redis.ResponseError):  # a key of another type: no counts
        replies[counted_at] = 0
    _raise_first(replies)
    version, active, marker, records, tombs, flags, counted, stored, *vectors = replies
    current = {
        cap_id: _Current(
            stored_record(record),
            int(tomb) if tomb else None,
            bool(has_vector),
            _previous_flag(flag),
        )
        for cap_id, record, tomb, flag, has_vector in zip(
            unique, records, tombs, flags, vectors, strict=True
        )
    }
    return int(version or 0), _spaces(active, marker, space), current, bool(counted) or not stored


def _previous_flag(raw: bytes | str | None) -> Flag | None:
    """A stored flag; an unreadable one counts as none (its approval is lost: it is reviewed
    again)."""
    try:
        return Flag.from_json(raw) if raw else None
    except (ValueError, KeyError, TypeError):
        return None


def _step(
    event: RegistryEvent,
    capability: Capability | None,
    current: _Current,
    vector_for: VectorFor,
) -> _Step:
    """What ``event`` does to its capability as ``current`` holds it (the vector made only
    when one is stored; the tool-poisoning flag of what is stored scanned now, its previous
    flag's approval carried over, :func:`capdisc.registry.flags.rescanned`)."""
    stored = current.stored
    if event.type == "reindex" and stored is not None and stored.readable:
        capability = Capability.from_dict(stored.capability)
    content_hash = capability.content_hash if capability else None
    decision = decide(event, stored, current.tombstone, content_hash, current.has_vector)
    vector = vector_for(capability) if decision in ("upsert", "reindex") and capability else None
    flag = rescanned(capability, current.flag) if vector and capability else None
    return _Step(
        event,
        decision,
        stored,
        _record_after(event, capability, decision, stored, vector),
        vector,
        flag,
    )


def _record_after(
    event: RegistryEvent,
    capability: Capability | None,
    decision: Decision,
    stored: StoredRecord | None,
    vector: bytes | None,
) -> StoredRecord | None:
    """The record stored once ``event`` is applied."""
    if decision == "unchanged" and capability is not None:
        return StoredRecord(
            capability.to_dict(), event.seq, capability.content_hash, event.occurred_at_ms
        )
    if decision in ("upsert", "reindex") and capability is not None and vector is not None:
        seq = stored.seq if decision == "reindex" and stored else event.seq
        return StoredRecord(
            capability.to_dict(), seq, capability.content_hash, int(time.time() * 1000)
        )
    if decision in ("upsert", "reindex", "delete"):
        return None
    return stored


def _advance(current: _Current, step: _Step) -> None:
    """``current`` as the next event of the same capability finds it after ``step``."""
    decision = step.decision
    if decision in ("delete", "absent"):
        current.tombstone = step.event.seq
    if decision not in ("upsert", "reindex", "delete", "unchanged"):
        return
    current.stored = step.after
    if decision == "unchanged":
        return
    current.flag = step.flag
    if step.after is not None:
        current.tombstone, current.has_vector = None, True
    else:
        current.has_vector = False


def _queue_flag(pipe: Any, tenant: str, cap_id: str, decision: Decision, flag: Flag | None) -> None:
    """Keep the flag beside the record an upsert or reindex writes (while the scan finds
    something), or drop it with the record a delete removes."""
    if decision in ("upsert", "reindex") and flag is not None:
        pipe.hset(keys.flags(tenant), cap_id, flag.to_json())
    elif decision in ("upsert", "reindex", "delete"):
        pipe.hdel(keys.flags(tenant), cap_id)


def _spaces(active: bytes | str | None, marker: dict[Any, Any], own: str) -> Spaces:
    """The :class:`Spaces` of a writer whose vector space is ``own``, from the tenant's active
    space and reindex marker as read."""
    build = {as_str(k): as_str(v) for k, v in marker.items()}
    staging = keys.staging_space(own, build["job"]) if build.get("target") == own else None
    return Spaces(own, as_str(active) if active else own, staging)


def needing_vectors(client: Redis, pending: list[Item], space: str) -> list[Capability]:
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
        stored = stored_record(record)
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


def _write(pipe: Any, step: _Step, version: int, spaces: Spaces, now_ms: int) -> int:
    """Queue what ``step`` changes (a tombstone applied at ``now_ms``); the tenant's version
    after it."""
    event, decision, before, after = step.event, step.decision, step.before, step.after
    tenant, cap_id = event.tenant, event.capability_id
    if decision in TOMBSTONING:
        pipe.hset(keys.tombstones(tenant), cap_id, event.seq)
        pipe.zadd(keys.tombstone_times(tenant), {cap_id: now_ms})
    if decision == "unchanged" and after is not None:
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(after.to_dict()))
        _index_source(pipe, tenant, cap_id, before, after)
    if decision not in ("upsert", "delete", "reindex"):
        return version
    version += 1
    if after is not None and step.vector is not None:
        pipe.hset(keys.caps(tenant), cap_id, json.dumps(after.to_dict()))
        _index_source(pipe, tenant, cap_id, before, after)
        for space in spaces.write_targets():
            pipe.hset(keys.vectors(tenant, space), cap_id, step.vector)
        pipe.hdel(keys.tombstones(tenant), cap_id)
        pipe.zrem(keys.tombstone_times(tenant), cap_id)
    else:
        pipe.hdel(keys.caps(tenant), cap_id)
        _index_source(pipe, tenant, cap_id, before, None)
        for space in spaces.delete_targets():
            pipe.hdel(keys.vectors(tenant, space), cap_id)
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


def read_snapshot(
    client: Redis, tenant: str, default_space: str, count: int = SCAN_COUNT
) -> Snapshot:
    """Everything a discovery worker needs for ``tenant``, from the vector space it is served
    from (``default_space`` until a writer has set one): version, last change id, flags and
    policy in one transaction, then the records and the vectors scanned ``count`` at a time
    (see :class:`Snapshot` for what that guarantees). The records are scanned before the
    vectors, so a record read has its vector (written with it) unless a later change removed
    it; a vector space swapped meanwhile is read again."""
    while True:
        with client.pipeline(transaction=True) as pipe:
            pipe.get(keys.space(tenant))
            pipe.get(keys.version(tenant))
            pipe.xrevrange(keys.CHANGES, count=1)
            pipe.hgetall(keys.flags(tenant))
            pipe.get(keys.poisoning_policy(tenant))
            active, version, last, flags, policy = pipe.execute()
        space = as_str(active) if active else default_space
        caps = scan_hash(client, keys.caps(tenant), count)
        vectors = scan_hash(client, keys.vectors(tenant, space), count)
        if client.get(keys.space(tenant)) == active:
            break
    records, unreadable = _readable(caps.keys(), parsed_records(caps.values()))
    return Snapshot(
        tenant=tenant,
        version=int(version or 0),
        records=records,
        unreadable=unreadable,
        vectors={as_str(k): v for k, v in vectors.items()},
        changes_id=as_str(last[0][0]) if last else "0-0",
        space=space,
        flags={as_str(k): Flag.from_json(v) for k, v in flags.items()},
        policy=as_str(policy) if policy is not None else None,
    )


def scan_hash(client: Redis, key: str, count: int = SCAN_COUNT) -> dict[Any, Any]:
    """The fields and values of hash ``key``, read ``count`` at a time with HSCAN: never one
    long command, however large the hash (a field changed meanwhile may be read at either
    value; one added or removed meanwhile may be missed or read)."""
    found: dict[Any, Any] = {}
    for piece in scan_pieces(client, key, count):
        found.update(piece)
    return found


def _readable(
    ids: Iterable[bytes | str], parsed: Iterable[Any]
) -> tuple[dict[str, StoredRecord], tuple[str, ...]]:
    """The records among ``parsed`` (by id) and the ids of the values that are no record."""
    records, unreadable = {}, []
    for raw_id, value in zip(ids, parsed, strict=True):
        record = stored_record(value)
        if record is not None and record.readable:
            records[as_str(raw_id)] = record
        else:
            unreadable.append(as_str(raw_id))
    return records, tuple(sorted(unreadable))


def _served(record: StoredRecord | None) -> StoredRecord | None:
    """What discovery serves of ``record``: nothing of one that is no record."""
    return record if record is not None and record.readable else None


def read_delta(client: Redis, tenant: str, ids: list[str], space: str) -> Delta:
    """The current record and vector of each of ``ids`` (``None`` where it is gone, or is no
    record), with the flags of those ids and the tenant's policy, in one transaction (a flag is
    never paired with another version of its record)."""
    if not ids:
        return Delta([], {}, None)
    with client.pipeline(transaction=True) as pipe:
        for cap_id in ids:
            pipe.hget(keys.caps(tenant), cap_id)
            pipe.hget(keys.vectors(tenant, space), cap_id)
        pipe.hmget(keys.flags(tenant), ids)
        pipe.get(keys.poisoning_policy(tenant))
        *raw, flags, policy = pipe.execute()
    entries = [(_served(stored_record(raw[i])), raw[i + 1]) for i in range(0, len(raw), 2)]
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
        record = stored_record(value)
        if record is not None and record.source == source:
            records[cap_id] = record
    return records


def stored_ids(client: Redis, tenant: str) -> list[str]:
    """Every id ``tenant``'s registry holds, sorted (HKEYS: the ids alone cross the wire,
    where a scan would carry every record too)."""
    return sorted(as_str(i) for i in client.hkeys(keys.caps(tenant)))


def owners(client: Redis, tenant: str, ids: Iterable[str], chunk: int = 1000) -> dict[str, str]:
    """The source each stored one of ``ids`` belongs to (its record's ``source_ref.source``,
    empty for a record stored without one); ids not stored are left out."""
    wanted = sorted(set(ids))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), chunk):
        part = wanted[start : start + chunk]
        for cap_id, raw in zip(part, client.hmget(keys.caps(tenant), part), strict=True):
            if (record := stored_record(raw)) is not None:
                found[cap_id] = record.source
    return found


def tenants(client: Redis) -> list[str]:
    return sorted(as_str(t) for t in client.smembers(keys.TENANTS))


def tenant_version(client: Redis, tenant: str) -> int:
    return int(client.get(keys.version(tenant)) or 0)


def vector_bytes(vector: Matrix) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()
