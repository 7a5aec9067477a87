"""Which Redis errors mean "running, but refusing writes for now", and what to do about each."""

from __future__ import annotations

import pytest
import redis

from capdisc.redisrefusal import advice, refuses_writes
from capdisc_workers.outage import waited_out


@pytest.mark.parametrize(
    ("error", "refused", "says"),
    [
        (redis.exceptions.OutOfMemoryError("command not allowed"), True, "raise maxmemory"),
        (redis.exceptions.ReadOnlyError("You can't write"), True, "primary"),
        (redis.exceptions.BusyLoadingError("loading"), True, "loading"),
        (redis.ResponseError("MISCONF Redis is configured to save"), True, "disk"),
        (redis.ResponseError("WRONGTYPE Operation against a key"), False, None),
        (redis.exceptions.NoPermissionError("NOPERM"), False, None),
        (ValueError("MISCONF"), False, None),
    ],
)
def test_a_refusal_to_write_is_told_from_other_errors(
    error: Exception, refused: bool, says: str | None
) -> None:
    assert refuses_writes(error) is refused
    if says is not None:
        assert says in advice(error)


@pytest.mark.parametrize(
    ("error", "waited"),
    [
        (redis.ConnectionError("gone"), True),
        (redis.TimeoutError("slow"), True),
        (redis.exceptions.OutOfMemoryError("full"), True),
        (redis.ResponseError("MISCONF cannot save"), True),
        (redis.ResponseError("WRONGTYPE"), False),
        (RuntimeError("a bug"), False),
    ],
)
def test_a_task_waits_out_redis_away_or_refusing_writes_and_nothing_else(
    error: Exception, waited: bool
) -> None:
    assert waited_out(error) is waited
