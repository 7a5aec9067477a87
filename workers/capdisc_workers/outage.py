"""Living through Redis going away: which errors mean "Redis is not there right now", the
backoff between attempts, and one log line when it goes and one when it is back.

Each loop of a worker (serving requests, following changes, heartbeats) has its own
connection and :class:`Backoff`, and reports to one shared :class:`RedisHealth`: the first
failure of any loop logs ``redis_unavailable``; once every loop that failed has succeeded again,
``redis_reconnected`` is logged with the outage's duration. Retries in between log nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from capdisc.redisrefusal import refuses_writes

#: Errors that mean Redis cannot be reached or is not ready (restarting, loading its data):
#: retried with backoff, never fatal. ``BusyLoadingError`` is a ``ConnectionError``.
RETRYABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)


def waited_out(exc: BaseException) -> bool:
    """Whether a task waits ``exc`` out (and is kept to run again) rather than failing: Redis
    away (:data:`RETRYABLE`), or running but refusing writes for now (full, cannot save:
    :func:`capdisc.redisrefusal.refuses_writes`)."""
    return isinstance(exc, RETRYABLE) or refuses_writes(exc)


#: First wait after a failure, doubling up to the cap: answers resume within about the cap
#: (plus one blocking read) after Redis is back.
BACKOFF_FIRST_S = 0.1
BACKOFF_CAP_S = 1.0


class Backoff:
    """Bounded exponential backoff: ``first_s``, doubling, at most ``cap_s``."""

    def __init__(self, first_s: float = BACKOFF_FIRST_S, cap_s: float = BACKOFF_CAP_S) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self._next_s = first_s

    def next(self) -> float:
        """How long to wait before the next attempt (and double the one after)."""
        delay = self._next_s
        self._next_s = min(self.cap_s, delay * 2)
        return delay

    def reset(self) -> None:
        self._next_s = self.first_s


class RedisHealth:
    """Whether the loops of one process reach Redis; says so once per outage."""

    def __init__(self, log: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, loop: str, exc: Exception) -> None:
        """``loop`` could not reach Redis; the first such report of an outage is logged."""
        with self._lock:
            self._failing.add(loop)
            if self._down_since is not None:
                return
            self._down_since = self._clock()
        self._log.warning(
            "redis_unavailable",
            loop=loop,
            error=str(exc),
            hint="retrying with backoff; requests wait in Redis meanwhile",
        )

    def ok(self, loop: str) -> None:
        """``loop`` reached Redis; when it was the last one failing, the outage is over."""
        if loop not in self._failing:  # the common case, without the lock
            return
        with self._lock:
            self._failing.discard(loop)
            if self._failing or self._down_since is None:
                return
            outage_s = self._clock() - self._down_since
            self._down_since = None
        self._log.info("redis_reconnected", outage_s=round(outage_s, 3))
