"""Tombstones are kept for a horizon, then forgotten.

A delete leaves a tombstone (:func:`capdisc.keys.tombstones`: the delete's ``seq``) so that an
older upsert of the same capability still in flight (reordered, re-sent, retried) cannot bring
it back. Kept forever, tombstones grow with every id a registry ever deleted or renamed, not
with the live registry. So the writer also records when each delete was applied, on Redis's
clock (:func:`capdisc.keys.tombstone_times`), and the reconciler forgets the tombstones older
than ``tombstone_horizon_s`` (:func:`prune_tombstones`): they then number at most the deletes
of one horizon. Within the horizon a late upsert is still stale; past it, it is applied.
"""

from __future__ import annotations

import redis

from capdisc import keys
from capdisc.redisclock import redis_now_ms

#: Tombstones forgotten per script call (each call holds Redis for about a millisecond).
PRUNE_BATCH = 1000

#: KEYS: tombstones, their times. ARGV: cutoff (ms), limit. Forgets the oldest tombstones applied
#: at or before the cutoff, atomically with their times: a delete applied again meanwhile has a
#: new time, so it is not in the range.
_PRUNE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids > 0 then
  redis.call('HDEL', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end
return #ids
"""


def prune_cutoff_ms(now_ms: int, horizon_s: float) -> int:
    """The newest delete time (ms) whose tombstone is forgotten at ``now_ms``."""
    return now_ms - int(horizon_s * 1000)


def prune_tombstones(client: redis.Redis, tenant: str, horizon_s: float) -> int:
    """Forget ``tenant``'s tombstones of deletes applied more than ``horizon_s`` ago; how many
    went. Tombstones written before their times were recorded are given the time now first,
    so they go one horizon later."""
    now_ms = redis_now_ms(client)
    _time_untimed(client, tenant, now_ms)
    script = client.register_script(_PRUNE)
    cutoff = prune_cutoff_ms(now_ms, horizon_s)
    pruned = 0
    while True:
        gone = int(
            script(
                keys=[keys.tombstones(tenant), keys.tombstone_times(tenant)],
                args=[cutoff, PRUNE_BATCH],
            )
        )
        pruned += gone
        if gone < PRUNE_BATCH:
            return pruned


def _time_untimed(client: redis.Redis, tenant: str, now_ms: int) -> None:
    """Record ``now_ms`` as the delete time of every tombstone of ``tenant`` without one."""
    tombs, times = keys.tombstones(tenant), keys.tombstone_times(tenant)
    if int(client.hlen(tombs)) <= int(client.zcard(times)):
        return
    batch: dict[bytes, int] = {}
    for cap_id, _seq in client.hscan_iter(tombs, count=PRUNE_BATCH):
        batch[cap_id] = now_ms
        if len(batch) >= PRUNE_BATCH:
            client.zadd(times, batch, nx=True)
            batch = {}
    if batch:
        client.zadd(times, batch, nx=True)
