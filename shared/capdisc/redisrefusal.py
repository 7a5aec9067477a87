"""Redis running but refusing writes: full, unable to save, a replica, or still loading.

Such a Redis answers reads and refuses every command that would add data: at ``maxmemory``
with ``noeviction`` (``OOM command not allowed``: the stack's Redis evicts nothing, since
evicting would lose registry data), when it cannot persist (``MISCONF``: a full disk), as a
read-only replica (``READONLY``), or while it loads its data after a start (``LOADING``). None
of these is fixed by the caller; each passes once the operator frees memory or disk or Redis
finishes loading. So a process waits them out as it waits out Redis going away, and says what
to do once (:func:`advice`).
"""

from __future__ import annotations

import redis

#: The redis-py errors of a Redis that runs but refuses writes (``MISCONF`` comes as a plain
#: :class:`redis.ResponseError`: see :func:`refuses_writes`).
REFUSING: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
)


def refuses_writes(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing writes for now (full, cannot save, replica, loading)."""
    return isinstance(exc, REFUSING) or (
        isinstance(exc, redis.ResponseError) and str(exc).startswith("MISCONF")
    )


def advice(exc: BaseException) -> str:
    """What the operator does about the refusal ``exc``."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return (
            "Redis is full (maxmemory reached; it evicts nothing): raise maxmemory or free "
            "memory (capdisc status shows the queues and dead letters)"
        )
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return "this Redis is a read-only replica: point capdisc at the primary"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return "Redis is loading its data after a start: wait for it"
    return "Redis cannot save to disk (a full disk?): free space where it keeps its files"
