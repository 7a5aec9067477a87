"""Drift between a tenant's records and its live vectors, repaired in Redis: orphan vectors
(no record) are dropped here; records without a vector are left for the caller to reindex. What
counts as drift is :func:`capdisc.registry.policy.plan_repair`.

The check reads every id of both hashes. Where HSCAN can leave the values out (``NOVALUES``:
Redis 7.4 and later, Valkey 8), it reads them a piece at a time, paced so that it keeps Redis
busy at most a quarter of the time, so no call holds Redis for long, and confirms what it
found before acting on it (a script drops a vector only while its
capability is still not stored and the tenant is served from the space read). Before that,
HSCAN would copy every value and it reads both hashes whole (HKEYS) in one optimistic
transaction: at 100,000 capabilities about 20 ms a hash, every other client waiting meanwhile
(``benchmarks/reconcile_stall.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis

from capdisc import keys
from capdisc.redistext import as_str
from capdisc.registry.policy import RepairPlan, plan_repair

Redis = redis.Redis

#: Ids asked for per HSCAN call (a hint to Redis), and orphans dropped per script call.
SCAN_COUNT = 250
#: The most of the time the check in pieces keeps Redis busy: after each HSCAN call it waits
#: until its calls took at most this share (:func:`scan_pause_s`). Unpaced, at a million
#: capabilities it took 15 x every other client's median round trip for its 3 s.
SCAN_DUTY = 0.25

#: KEYS: the tenant's records, its vectors in the space read, its space key. ARGV: the space
#: key's value when read ('' when it was not set), then the orphan candidates. Drops each
#: candidate that is still not stored; false when the tenant moved to another space meanwhile.
_DROP_ORPHANS = """
local active = redis.call('GET', KEYS[3]) or ''
if active ~= ARGV[1] then return false end
local dropped = {}
for i = 2, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 and redis.call('HDEL', KEYS[2], ARGV[i]) == 1 then
    dropped[#dropped + 1] = ARGV[i]
  end
end
return dropped
"""


def repair_plan(client: Redis, tenant: str, default_space: str) -> RepairPlan | None:
    """Compare ``tenant``'s records with its live vectors and drop the orphan vectors (None
    when a write meanwhile leaves it to the next run). The plan's ``missing_vectors`` are for
    the caller to reindex."""
    try:
        return repair_plan_in_pieces(client, tenant, default_space)
    except redis.ResponseError as exc:
        if not _no_novalues(exc):
            raise
    return repair_plan_whole(client, tenant, default_space)


def field_names(
    client: Any, key: str, count: int = SCAN_COUNT, duty: float = SCAN_DUTY
) -> Iterator[str]:
    """The fields of hash ``key`` without their values, about ``count`` an HSCAN call, each
    call followed by :func:`scan_pause_s` (a field may come twice).
    :class:`redis.ResponseError` where HSCAN has no ``NOVALUES``."""
    cursor = 0
    while True:
        started = time.monotonic()
        cursor, names = client.hscan(key, cursor, count=count, no_values=True)
        took_s = time.monotonic() - started
        yield from (as_str(name) for name in names)
        if cursor == 0:
            return
        time.sleep(scan_pause_s(took_s, duty))


def scan_pause_s(took_s: float, duty: float = SCAN_DUTY) -> float:
    """The wait after a call that took ``took_s`` (its round trip: at least what it held
    Redis) so that the calls take at most ``duty`` of the time (1: no wait)."""
    return took_s * (1 - duty) / duty


def _no_novalues(exc: redis.ResponseError) -> bool:
    """Whether the server refused HSCAN's ``NOVALUES`` (a server before Redis 7.4)."""
    return "syntax" in str(exc).lower()


def repair_plan_in_pieces(client: Redis, tenant: str, default_space: str) -> RepairPlan | None:
    """:func:`repair_plan` reading both hashes' ids a piece at a time (``NOVALUES``; else
    :class:`redis.ResponseError`), then confirming each orphan and missing vector."""
    active = client.get(keys.space(tenant))
    space = as_str(active) if active else default_space
    plan = plan_repair(
        set(field_names(client, keys.caps(tenant))),
        set(field_names(client, keys.vectors(tenant, space))),
    )
    read = as_str(active) if active else ""
    dropped = drop_orphans(client, tenant, space, read, plan.orphan_vectors)
    if dropped is None:
        return None
    missing = _still_missing(client, tenant, space, plan.missing_vectors)
    return RepairPlan(missing_vectors=missing, orphan_vectors=dropped)


def drop_orphans(
    client: Redis, tenant: str, space: str, active: str, candidates: list[str]
) -> list[str] | None:
    """Drop the vectors in ``space`` of ``candidates`` still not stored (one stored meanwhile
    keeps its vector); the ids dropped. None when the tenant's space key no longer says
    ``active`` ('' for not set): it moved to another space since it was read, and no more is
    dropped (what an earlier call of a long list dropped were orphans when it did)."""
    script = client.register_script(_DROP_ORPHANS)
    watched = [keys.caps(tenant), keys.vectors(tenant, space), keys.space(tenant)]
    dropped: list[str] = []
    # called once even with no candidate: the space read must still be the tenant's
    for start in range(0, max(1, len(candidates)), SCAN_COUNT):
        reply = script(keys=watched, args=[active, *candidates[start : start + SCAN_COUNT]])
        if reply is None:
            return None
        dropped += [as_str(cap_id) for cap_id in reply]
    return dropped


def _still_missing(client: Redis, tenant: str, space: str, candidates: list[str]) -> list[str]:
    """The records without a vector read in pieces that are stored and without one still (one
    written meanwhile was written with its vector)."""
    missing: list[str] = []
    for start in range(0, len(candidates), SCAN_COUNT):
        chunk = candidates[start : start + SCAN_COUNT]
        with client.pipeline(transaction=False) as pipe:
            for cap_id in chunk:
                pipe.hexists(keys.caps(tenant), cap_id)
                pipe.hexists(keys.vectors(tenant, space), cap_id)
            found = pipe.execute()
        pairs = zip(chunk, found[::2], found[1::2], strict=True)
        missing += [cap_id for cap_id, stored, vector in pairs if stored and not vector]
    return missing


def repair_plan_whole(client: Redis, tenant: str, default_space: str) -> RepairPlan | None:
    """:func:`repair_plan` reading both hashes' ids whole (HKEYS) in one optimistic
    transaction (a write meanwhile: None)."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.caps(tenant), keys.space(tenant))  # type: ignore[no-untyped-call]
            active = pipe.get(keys.space(tenant))
            space = as_str(active) if active else default_space
            plan = plan_repair(
                {as_str(k) for k in pipe.hkeys(keys.caps(tenant))},
                {as_str(k) for k in pipe.hkeys(keys.vectors(tenant, space))},
            )
            pipe.multi()
            if plan.orphan_vectors:
                pipe.hdel(keys.vectors(tenant, space), *plan.orphan_vectors)
            pipe.execute()
        except redis.WatchError:
            return None
    return plan
