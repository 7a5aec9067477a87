"""A tenant's records counted by kind and by source, kept beside them, so that ``capdisc
status`` reads a few numbers instead of parsing every record (18 s and a gigabyte of replies
at a million capabilities).

The counts hash (:func:`capdisc.keys.record_counts`) holds ``kind:K`` and ``source:S`` counts,
``unreadable`` (stored values that are no record, found by the last count) and the
:data:`COMPLETE` mark. Every write of a record changes it in the same transaction
(:func:`deltas`, queued by :mod:`capdisc.registry.store`), so it is exact as long as records are
written by capdisc: a tenant whose first records are written with it has it from the start,
and a registry written before it is counted once by the reconciler (:func:`recount`, which
stores its count only if no record changed while it read them). A value overwritten outside
capdisc is seen when capdisc next writes that id: the counts then no longer add up to the
records, and the reconciler counts again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from capdisc import keys
from capdisc.redisscan import scan_pieces
from capdisc.redistext import as_str
from capdisc.registry.policy import StoredRecord, parsed_records, stored_record

#: The field that marks the counts hash complete (a count that began before any record).
COMPLETE = "complete"

#: Delete each named field whose count is still 0 (ARGV: the fields); how many went.
_PRUNE = """
local gone = 0
for _, name in ipairs(ARGV) do
  if redis.call('HGET', KEYS[1], name) == '0' then
    gone = gone + redis.call('HDEL', KEYS[1], name)
  end
end
return gone
"""


def deltas(changes: Iterable[tuple[StoredRecord | None, StoredRecord | None]]) -> Counter[str]:
    """How the counts move when each ``(before, after)`` record is written (None: absent; an
    unreadable value before is one ``unreadable`` fewer)."""
    moved: Counter[str] = Counter()
    for before, after in changes:
        for record, sign in ((before, -1), (after, 1)):
            if record is None:
                continue
            if not record.readable:
                moved["unreadable"] += sign
                continue
            moved[f"kind:{record.capability.get('kind', '')}"] += sign
            moved[f"source:{record.source}"] += sign
    return Counter({name: change for name, change in moved.items() if change})


def queue(pipe: Any, tenant: str, moved: Counter[str]) -> range:
    """Queue ``moved`` on ``tenant``'s counts (in the transaction that writes the records);
    the positions of the queued commands in the transaction's replies. Should one fail (a
    count damaged by hand), the records are written all the same (Redis runs every command
    of a transaction) and the counts are wrong from then on: the writer drops them
    (:func:`drop`)."""
    start = len(pipe)  # commands queued so far
    for name, change in moved.items():
        pipe.hincrby(keys.record_counts(tenant), name, change)
    pipe.hset(keys.record_counts(tenant), COMPLETE, 1)
    return range(start, len(pipe))


def drop(client: Any, tenant: str) -> None:
    """Delete ``tenant``'s counts: status reads the records and the reconciler counts again."""
    client.delete(keys.record_counts(tenant))


@dataclass
class RecordCounts:
    """``tenant``'s readable records by kind and by source, and the values that are no record
    (their ids when the records were read, else only how many)."""

    kinds: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    unreadable: int = 0
    unreadable_ids: list[str] = field(default_factory=list)
    #: Kept counts that went down to 0 (a source or kind no record has any more; :func:`prune`).
    emptied: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.kinds.values()) + self.unreadable

    def add(self, cap_id: str, record: StoredRecord | None) -> None:
        if record is None or not record.readable:
            self.unreadable += 1
            self.unreadable_ids.append(cap_id)
        else:
            self.kinds[str(record.capability.get("kind", ""))] += 1
            self.sources[record.source] += 1

    def fields(self) -> dict[str, int]:
        """As the counts hash holds them."""
        return {
            **{f"kind:{k}": n for k, n in self.kinds.items()},
            **{f"source:{s}": n for s, n in self.sources.items()},
            "unreadable": self.unreadable,
            COMPLETE: 1,
        }


def kept(client: Any, tenant: str, atomic: bool = False) -> RecordCounts | None:
    """The counts kept for ``tenant``, when complete, readable and they add up to its records
    (else None: the records must be read, :func:`read`, and the reconciler counts again).
    Read in one transaction with ``atomic``; without (a monitoring user may not run one) a
    write between the two reads makes them disagree, and the records are read instead."""
    with client.pipeline(transaction=atomic) as pipe:
        pipe.hgetall(keys.record_counts(tenant))
        pipe.hlen(keys.caps(tenant))
        raw, stored = pipe.execute(raise_on_error=False)
    if isinstance(stored, Exception):
        raise stored
    if isinstance(raw, redis.ResponseError):  # a key of another type where the counts go
        return None
    try:
        held = {as_str(k): int(v) for k, v in raw.items()}
    except ValueError:  # a count written by hand or damaged: read the records, count again
        return None
    if not held.pop(COMPLETE, 0):
        return None
    counts = RecordCounts(unreadable=held.pop("unreadable", 0))
    for name, count in held.items():
        kind, _, value = name.partition(":")
        if count > 0:
            (counts.kinds if kind == "kind" else counts.sources)[value] = count
        elif count == 0:
            counts.emptied.append(name)
    return counts if counts.total == int(stored) else None


def prune(client: Any, tenant: str, emptied: list[str]) -> int:
    """Delete the ``emptied`` counts that are still 0 (a write may have raised one since they
    were read), so that sources gone long ago do not pile up in the hash; how many went."""
    return int(client.register_script(_PRUNE)(keys=[keys.record_counts(tenant)], args=emptied))


def read(client: Any, tenant: str) -> RecordCounts:
    """``tenant``'s records counted by reading every one, a piece at a time, so that neither
    Redis nor this process holds the whole tenant (a field HSCAN returns twice is counted
    once)."""
    counts, seen = RecordCounts(), set()
    for piece in scan_pieces(client, keys.caps(tenant)):
        ids = [as_str(k) for k in piece]
        for cap_id, value in zip(ids, parsed_records(piece.values()), strict=True):
            if cap_id not in seen:
                seen.add(cap_id)
                counts.add(cap_id, stored_record(value))
    counts.unreadable_ids.sort()
    return counts


def recount(
    client: redis.Redis, tenant: str, reader: Callable[[Any, str], RecordCounts] = read
) -> RecordCounts | None:
    """Count ``tenant``'s records (with ``reader``: :func:`read`) and store the counts, unless
    a record changed while they were read (the records are watched from the start: the next
    run tries again); the counts, or None when they were not stored."""
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(keys.caps(tenant), keys.record_counts(tenant))  # type: ignore[no-untyped-call]
        counts = reader(client, tenant)  # through another connection: the watch still holds
        pipe.multi()
        pipe.delete(keys.record_counts(tenant))
        pipe.hset(keys.record_counts(tenant), mapping=cast("dict[Any, int]", counts.fields()))
        try:
            pipe.execute()
        except redis.WatchError:
            return None
    return counts
