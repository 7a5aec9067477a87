"""Sessions in Redis: each session's state (one JSON value), its event stream, and the bounded
registry of live sessions. The policy is :mod:`capdisc.session`; this module only reads and
writes, one optimistic transaction per change, so any discovery worker can serve any turn.

A session expires ``max_age_s`` after it was created; when more than ``max_sessions`` are live,
the least recently active go first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis

from capdisc import keys
from capdisc.errors import SessionNotFoundError
from capdisc.session import SessionEvent, SessionPolicy, SessionState, new_session

#: Events kept per session stream (approximate).
EVENTS_MAXLEN = 1000

T = TypeVar("T")
#: A change: the current state in, the new state, its events and a result out.
Change = Callable[[SessionState], tuple[SessionState, list[SessionEvent], T]]


def load(client: redis.Redis, tenant: str, session_id: str) -> SessionState | None:
    raw = client.get(keys.session(tenant, session_id))
    return SessionState.from_dict(json.loads(raw)) if raw else None


def update(client: redis.Redis, tenant: str, session_id: str, change: Change[T],
           policy: SessionPolicy, now_ms: int, *, profile: str | None = None,
           create: bool = True, request_id: str = "") -> T:
    """Apply ``change`` to the session atomically (retrying on a concurrent write): the state,
    its events on the session stream and its place among live sessions, together."""
    key = keys.session(tenant, session_id)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                raw = pipe.get(key)
                if raw is None and not create:
                    raise SessionNotFoundError(f"session {session_id!r} of tenant {tenant!r} "
                                               "does not exist (or expired)")
                state = (SessionState.from_dict(json.loads(raw)) if raw
                         else new_session(session_id, profile, now_ms))
                state, events, result = change(state)
                pipe.multi()
                _write(pipe, tenant, state, events, policy, now_ms, request_id)
                pipe.execute()
                break
            except redis.WatchError:
                continue
    if raw is None:
        _bound_live_sessions(client, tenant, policy, now_ms)
    return result


def _write(pipe: Any, tenant: str, state: SessionState, events: list[SessionEvent],
           policy: SessionPolicy, now_ms: int, request_id: str) -> None:
    expires_ms = state.created_ms + int(policy.max_age_s * 1000)
    key = keys.session(tenant, state.session_id)
    stream = keys.session_events(tenant, state.session_id)
    pipe.set(key, json.dumps(state.to_dict(), separators=(",", ":")), pxat=expires_ms)
    for event in events:
        pipe.xadd(stream, {**event.to_fields(), "request_id": request_id},
                  maxlen=EVENTS_MAXLEN, approximate=True)
    if events:
        pipe.pexpireat(stream, expires_ms)
    pipe.zadd(keys.sessions(tenant), {state.session_id: now_ms})


def _bound_live_sessions(client: redis.Redis, tenant: str, policy: SessionPolicy,
                         now_ms: int) -> None:
    """Forget sessions past their age and, over ``max_sessions``, the least recently active."""
    registry = keys.sessions(tenant)
    expired = client.zrangebyscore(registry, 0, now_ms - int(policy.max_age_s * 1000))
    excess = int(client.zcard(registry)) - len(expired) - policy.max_sessions
    oldest = client.zrange(registry, len(expired), len(expired) + excess - 1) if excess > 0 else []
    gone = [_str(s) for s in [*expired, *oldest]]
    if not gone:
        return
    with client.pipeline(transaction=False) as pipe:
        pipe.zrem(registry, *gone)
        for session_id in gone:
            pipe.delete(keys.session(tenant, session_id), keys.session_events(tenant, session_id))
        pipe.execute()


def events(client: redis.Redis, tenant: str, session_id: str, after: str = "0-0",
           block_ms: int = 1000) -> list[tuple[str, dict[str, str]]]:
    """Session events after stream id ``after`` (waiting up to ``block_ms`` for one)."""
    batch: Any = client.xread({keys.session_events(tenant, session_id): after}, count=100,
                              block=block_ms)
    return [(_str(eid), {_str(k): _str(v) for k, v in fields.items()})
            for _stream, items in batch or [] for eid, fields in items]


def follow(client: redis.Redis, tenant: str, session_id: str, after: str = "0-0",
           stop: Callable[[], bool] = lambda: False) -> Iterator[dict[str, str]]:
    """Every event of the session from ``after`` on, as it happens (in one-second slices)."""
    while not stop():
        for entry_id, fields in events(client, tenant, session_id, after):
            after = entry_id
            yield {"id": entry_id, **fields}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
