"""What the swap at the end of a full reindex costs every other Redis client.

The swap renames the staging vectors over the live space (the same space when the model did
not change, the common case). RENAME deletes the hash it replaces before it returns: every
vector of the tenant freed while Redis serves no one. This benchmark fills a Redis of its own
with --size live and --size staging vectors (384-dimensional float32) and swaps them, two
ways, alternating, --rounds times each (filled again before each):

- ``RENAME over``: one MULTI with the RENAME alone, as the swap did before (the baseline,
  measured in the same run);
- ``UNLINK, RENAME``: the live vectors UNLINKed first in the same MULTI, as the swap does now
  (:func:`capdisc.registry.reindexstore.finish_reindex`): Redis frees them in a background
  thread.

Meanwhile another client sends PING after PING (the probe of ``redis_full_read.py``).

    .venv/bin/python benchmarks/reindex_swap_stall.py [--size 100000] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).parent))

from capdisc import keys
from redis_full_read import TENANT, arguments, compare

LIVE, STAGING = keys.vectors(TENANT, "minilm"), keys.vectors(TENANT, "minilm~job")


def fill(client: redis.Redis, size: int) -> None:
    rng = np.random.default_rng(0)
    pipe = client.pipeline(transaction=False)
    for key in (LIVE, STAGING):
        for number in range(size):
            pipe.hset(key, f"tool:bench-{number}", rng.random(384, dtype=np.float32).tobytes())
            if number % 2000 == 1999:
                pipe.execute()
    pipe.execute()


def rename_over(client: redis.Redis) -> int:
    with client.pipeline(transaction=True) as pipe:
        pipe.rename(STAGING, LIVE)
        pipe.execute()
    return int(client.exists(STAGING))


def unlink_then_rename(client: redis.Redis) -> int:
    with client.pipeline(transaction=True) as pipe:
        pipe.unlink(LIVE)
        pipe.rename(STAGING, LIVE)
        pipe.execute()
    return int(client.exists(STAGING))


def main() -> None:
    args = arguments(__doc__)
    ways = {"RENAME over": (rename_over, 0), "UNLINK, RENAME": (unlink_then_rename, 0)}
    compare(args, ways, "swap", described, before_each=lambda c: fill(c, args.size))


def described(_client: redis.Redis, size: int) -> str:
    """Filled before each swap instead (``before_each``)."""
    return (
        f"{size:,} live and {size:,} staging vectors of 384 float32 each, filled before each swap"
    )


if __name__ == "__main__":
    main()
