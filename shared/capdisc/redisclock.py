"""One clock for the whole fleet: the Redis server's.

Times that one process writes and another compares (a worker's heartbeat against the sweeper's
"now", a request's deadline against the discovery worker's) must come from one clock: hosts'
clocks differ, and a step of one (NTP, a VM resumed) would otherwise make a live worker look
dead, a dead one alive, or every request look expired on arrival. Redis's ``TIME`` is that
clock. :func:`redis_now_ms` reads it (one round trip, for what runs every few seconds);
:class:`RedisClock` keeps this host's offset from it, for what runs per request, and measures
it again every ``resync_s``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

#: How often a :class:`RedisClock` measures its offset again (a local clock step is followed
#: within this long).
RESYNC_S = 5.0


def redis_now_ms(client: Any) -> int:
    """The Redis server's time now, in milliseconds since the epoch (``TIME``). A Redis user
    whose ACL does not allow ``TIME`` gets this host's time, with one warning per process."""
    return redis_now_us(client) // 1000


def redis_now_ns(client: Any) -> int:
    """The Redis server's time now in nanoseconds since the epoch (to the microsecond): the
    sequence of events sent now, so that two producers' events are ordered by one clock
    whatever theirs say. As :func:`redis_now_ms` when ``TIME`` is refused."""
    return redis_now_us(client) * 1000


def redis_now_us(client: Any) -> int:
    """The Redis server's time now, in microseconds since the epoch."""
    try:
        seconds, micros = client.time()
    except redis.exceptions.NoPermissionError as exc:
        _warn_no_time(exc)
        return time.time_ns() // 1000
    return int(seconds) * 1_000_000 + int(micros)


_warned: list[bool] = []


def _warn_no_time(exc: Exception) -> None:
    import structlog  # only here: `capdisc discover` starts without loading it

    if not _warned:
        _warned.append(True)
        structlog.get_logger("capdisc").warning(
            "redis_time_refused",
            error=str(exc),
            hint="this Redis user may not run TIME, so this process compares times on its "
            "own host's clock (wrong when hosts' clocks differ); add +time to its ACL user "
            "(infra/redis-users.acl)",
        )


class RedisClock:
    """The Redis server's time, as this host's clock plus an offset measured with ``TIME``
    (taken mid-way through the round trip) at most every ``resync_s``. While Redis cannot be
    reached, the last offset is kept (0 before the first measure), and it is tried again only
    after ``resync_s``, so a caller never waits on it twice in a row."""

    def __init__(self, resync_s: float = RESYNC_S) -> None:
        self.resync_s = resync_s
        self.offset_ms = 0.0
        self._next_sync = 0.0
        self._lock = threading.Lock()

    def now_ms(self, client: Any) -> float:
        """Redis's time now (ms since the epoch), measuring the offset again when due."""
        if time.monotonic() >= self._next_sync:
            self._sync(client)
        return time.time() * 1000 + self.offset_ms

    def _sync(self, client: Any) -> None:
        with self._lock:
            if time.monotonic() < self._next_sync:
                return  # another thread measured meanwhile
            self._next_sync = time.monotonic() + self.resync_s
            before = time.time()
            try:
                server_ms = redis_now_ms(client)
            except redis.RedisError:
                return  # the caller meets the outage itself; the last offset stands
            self.offset_ms = server_ms - (before + time.time()) * 500
