"""Sessions in Redis: each session's state (a hash: its JSON and a revision), its event stream,
and the bounded registry of live sessions. The policy is :mod:`capdisc.sessions.policy`; this
module only
reads and writes, one compare-and-set per change (a Lua script), so any discovery worker can
serve any turn and concurrent writers never lose an update.

A session expires ``max_age_s`` after it was created; when more than ``max_sessions`` are live,
the least recently active go first.

A session's event stream is named with a keyed hash of its tenant and id
(:func:`stream_key`): the secret is in Redis where only discovery workers read it, so a watcher
learns the name from a discovery worker that checked its token (``Client.watch_session``), and
Redis's client role, which may read session streams, cannot name another tenant's.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis

from capdisc import keys
from capdisc.redistext import as_str
from capdisc.sessions.policy import SessionEvent, SessionPolicy, SessionState, new_session

#: Events kept per session stream (approximate).
EVENTS_MAXLEN = 1000
#: Pause between reads of a session's events while Redis cannot be reached.
OUTAGE_RETRY_S = 0.1

T = TypeVar("T")
#: A change: the current state in, the new state, its events and a result out.
Change = Callable[[SessionState], tuple[SessionState, list[SessionEvent], T]]


def stream_key(client: redis.Redis, tenant: str, session_id: str) -> str:
    """The key of the session's event stream (:func:`capdisc.keys.session_events`), named with
    the sessions' secret as Redis holds it now (made there when missing: a Redis that lost its
    data gets a new one, and every process names the streams with it from then on)."""
    return keys.session_events(tenant, session_id, _secret(client))


def _secret(client: redis.Redis) -> str:
    secret = client.get(keys.SESSIONS_SECRET)
    if secret is None:
        client.set(keys.SESSIONS_SECRET, secrets.token_hex(32), nx=True)
        secret = client.get(keys.SESSIONS_SECRET)
    return as_str(secret or b"")


def load(client: redis.Redis, tenant: str, session_id: str) -> SessionState | None:
    raw = client.hget(keys.session(tenant, session_id), "state")
    return SessionState.from_dict(json.loads(raw)) if raw else None


def ended(client: redis.Redis, tenant: str, session_id: str) -> str:
    """Why a session that is not live ended, where that is still known (:data:`EXPIRED`,
    :data:`EVICTED`), else ""."""
    marker = client.hget(keys.session(tenant, session_id), "ended")
    if marker:
        return as_str(marker)
    return EXPIRED if client.zscore(keys.sessions(tenant), session_id) is not None else ""


#: Compare-and-set of one session: the state is written (with its events, expiry and place
#: among live sessions, which expires ``max_age_s`` after the last of them: a tenant whose
#: agents stopped leaves nothing behind, and an agent back within that time is told its
#: session ended) only if its revision is still the one the writer started from; else
#: the current revision and state come back, for the writer to apply its change to. A request
#: id already applied returns the outcome it had (kept request_memory_s): exactly-once effects.
#: A session written anew says why its earlier life ended, if it had one: ``expired`` (its
#: state is gone but it is still among the live sessions) or what an ``ended`` marker says
#: (:data:`EVICTED`), and a ``restarted`` event (its reason why) goes ahead of the change's
#: own on its stream. The events' stream is named with the sessions' secret the writer knows;
#: when Redis holds another (or none: it lost its data), that one comes back and nothing is
#: written.
_CAS = """
local secret = redis.call('GET', KEYS[5]) or ''
if secret == '' or secret ~= ARGV[13] then return {3, secret} end
if KEYS[4] ~= '' then
  local done = redis.call('GET', KEYS[4])
  if done then return {2, done} end
end
local rev = redis.call('HGET', KEYS[1], 'rev') or ''
if rev ~= ARGV[1] then return {0, rev, redis.call('HGET', KEYS[1], 'state') or ''} end
local ended = ''
if rev == '' then
  ended = redis.call('HGET', KEYS[1], 'ended') or ''
  if ended == '' and redis.call('ZSCORE', KEYS[3], ARGV[8]) then ended = 'expired' end
  redis.call('HDEL', KEYS[1], 'ended')
end
redis.call('HSET', KEYS[1], 'rev', ARGV[2], 'state', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
local events = cjson.decode(ARGV[7])
if ended ~= '' then table.insert(events, 1, {'restarted', ARGV[6], '', ended}) end
for _, e in ipairs(events) do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'type', e[1], 'at_ms', e[2],
             'tool', e[3], 'reason', e[4], 'request_id', ARGV[9])
end
if #events > 0 then redis.call('PEXPIREAT', KEYS[2], ARGV[4]) end
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[8])
local index_until = tonumber(ARGV[4]) + tonumber(ARGV[12])
local ttl = redis.call('PTTL', KEYS[3])
if ttl < 0 or tonumber(ARGV[6]) + ttl < index_until then
  redis.call('PEXPIREAT', KEYS[3], index_until)
end
if KEYS[4] ~= '' then redis.call('SET', KEYS[4], ARGV[10], 'PX', ARGV[11]) end
return {1, ended}
"""


class StateCache:
    """The states this process last wrote, with their revisions (bounded, least recently used
    first out): a turn of a session this process served last costs one round trip."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._states: OrderedDict[tuple[str, str], tuple[str, SessionState]] = OrderedDict()
        self._lock = threading.Lock()
        #: The sessions' secret as last seen in Redis (each write checks it is still the one).
        self.secret = ""

    def get(self, key: tuple[str, str]) -> tuple[str, SessionState | None]:
        with self._lock:
            hit = self._states.get(key)
            if hit is None:
                return "", None
            self._states.move_to_end(key)
            return hit

    def put(self, key: tuple[str, str], revision: str, state: SessionState) -> None:
        with self._lock:
            self._states[key] = (revision, state)
            self._states.move_to_end(key)
            while len(self._states) > self._size:
                self._states.popitem(last=False)


#: Why a session's earlier life ended: it outlived ``max_age_s``, or it was dropped as the
#: least recently active beyond ``max_sessions`` (an ``ended`` marker says so for ``max_age_s``).
EXPIRED = "expired"
EVICTED = "evicted"


def update(
    client: redis.Redis,
    tenant: str,
    session_id: str,
    change: Change[T],
    policy: SessionPolicy,
    now_ms: int,
    *,
    profile: str | None = None,
    request_id: str = "",
    cache: StateCache | None = None,
) -> tuple[T, str]:
    """Apply ``change`` to the session atomically: the state, its events on the session stream
    and its place among live sessions, together. Optimistic: the change is applied to the state
    this process last wrote (or a new session) and written if nobody wrote since; otherwise the
    script returns the current state and the change is applied again to that. The result, and
    when this write started the session again after its earlier life ended, why it ended
    (:data:`EXPIRED`, :data:`EVICTED`; else "")."""
    key = keys.session(tenant, session_id)
    cas = client.register_script(_CAS)
    cache = cache if cache is not None else StateCache(1)
    revision, known = cache.get((tenant, session_id))
    request_key = keys.session_request(tenant, session_id, request_id) if request_id else ""
    while True:
        state = known if known is not None else new_session(session_id, profile, now_ms)
        state, events, result = change(state)
        args = _cas_args(state, events, revision, policy, now_ms, request_id)
        stream = keys.session_events(tenant, session_id, cache.secret)
        reply = cas(
            keys=[key, stream, keys.sessions(tenant), request_key, keys.SESSIONS_SECRET],
            args=[
                *args,
                json.dumps(result),
                int(policy.request_memory_s * 1000),
                int(policy.max_age_s * 1000),
                cache.secret,
            ],
        )
        if int(reply[0]) == 3:  # another secret names the streams now (or none yet)
            cache.secret = as_str(reply[1]) or _secret(client)
            continue
        if int(reply[0]) == 2:  # applied before: its first outcome, nothing changed
            done: T = json.loads(reply[1])
            return done, ""
        if int(reply[0]) == 1:
            cache.put((tenant, session_id), str(args[1]), state)
            break
        revision = as_str(reply[1])
        known = SessionState.from_dict(json.loads(reply[2])) if reply[2] else None
    if not revision:
        _bound_live_sessions(client, tenant, policy, now_ms)
    return result, as_str(reply[1]) if len(reply) > 1 else ""


def _cas_args(
    state: SessionState,
    events: list[SessionEvent],
    expected: str,
    policy: SessionPolicy,
    now_ms: int,
    request_id: str,
) -> list[Any]:
    """The script's arguments (events travel as one JSON array: fewer arguments to pack)."""
    revision = next_revision(expected)
    expires_ms = state.created_ms + int(policy.max_age_s * 1000)
    rows = [[e.type, str(e.at_ms), e.tool, e.reason] for e in events]
    return [
        expected,
        revision,
        json.dumps(state.to_dict(), separators=(",", ":")),
        expires_ms,
        EVENTS_MAXLEN,
        now_ms,
        json.dumps(rows),
        state.session_id,
        request_id,
    ]


def next_revision(expected: str) -> str:
    """The revision after ``expected``: ``lineage:count``, where a new session (no revision)
    starts a fresh random lineage. A session expired or evicted and started again under the
    same id never repeats a revision of the one before, so a writer holding a state of the old
    one cannot pass the compare-and-set and overwrite the new one with it."""
    if not expected:
        return f"{secrets.token_hex(6)}:1"
    lineage, _, count = expected.rpartition(":")
    return f"{lineage}:{int(count) + 1}" if lineage else str(int(count) + 1)


def _bound_live_sessions(
    client: redis.Redis, tenant: str, policy: SessionPolicy, now_ms: int
) -> None:
    """Forget sessions past their age and, over ``max_sessions``, the least recently active,
    leaving each of those an ``ended`` marker (for ``max_age_s``): its agent's next turn is
    told why its working set is gone; and in place of its events, one ``ended`` event (reason
    ``evicted``, kept as long), which tells a watcher at once."""
    registry = keys.sessions(tenant)
    expired = client.zrangebyscore(registry, 0, now_ms - int(policy.max_age_s * 1000))
    excess = int(client.zcard(registry)) - len(expired) - policy.max_sessions
    oldest = client.zrange(registry, len(expired), len(expired) + excess - 1) if excess > 0 else []
    gone = [as_str(s) for s in [*expired, *oldest]]
    if not gone:
        return
    marker_ms = int(policy.max_age_s * 1000)
    secret = _secret(client)
    with client.pipeline(transaction=False) as pipe:
        pipe.zrem(registry, *gone)
        for session_id in gone:
            stream = keys.session_events(tenant, session_id, secret)
            pipe.delete(keys.session(tenant, session_id), stream)
        for session_id in (as_str(s) for s in oldest):  # its agent may still be at work
            pipe.hset(keys.session(tenant, session_id), "ended", EVICTED)
            pipe.pexpire(keys.session(tenant, session_id), marker_ms)
            stream = keys.session_events(tenant, session_id, secret)
            pipe.xadd(
                stream,
                {"type": "ended", "at_ms": now_ms, "tool": "", "reason": EVICTED, "request_id": ""},
            )
            pipe.pexpire(stream, marker_ms)
        pipe.execute()


def move_legacy_sessions(client: redis.Redis, count: int = 1000) -> int:
    """Move the sessions, and each tenant's index of them, that an earlier version kept under
    the tenants' registry keys (:data:`capdisc.keys.LEGACY_SESSION_MATCH`) to their own
    prefix, each key renamed whole (its expiry goes with it); returns how many keys moved. A
    key already moved, by another worker doing the same, is passed over; a session already
    started again under the new key keeps that one, and the old key is left to expire."""
    moved = 0
    for raw in client.scan_iter(match=keys.LEGACY_SESSION_MATCH, count=count):
        old = as_str(raw)
        new = keys.from_legacy_session_key(old)
        if new is None:
            continue
        try:
            moved += _move_key(client, old, new)
        except redis.ResponseError:  # gone meanwhile: moved by another worker, or expired
            continue
    return moved


def _move_key(client: redis.Redis, old: str, new: str) -> int:
    """Rename ``old`` to ``new`` unless that exists; a tenant's index of live sessions that
    exists under both is merged (each session's latest activity), keeping the later expiry."""
    if client.renamenx(old, new):
        return 1
    if as_str(client.type(old)) != "zset" or as_str(client.type(new)) != "zset":
        return 0  # a session started again under its new key keeps that one
    expiry_ms = max(int(client.pttl(old)), int(client.pttl(new)))
    with client.pipeline(transaction=True) as pipe:
        pipe.zunionstore(new, [new, old], aggregate="MAX")
        pipe.delete(old)
        if expiry_ms > 0:
            pipe.pexpire(new, expiry_ms)
        pipe.execute()
    return 1


def events(
    client: redis.Redis, stream: str, after: str = "0-0", block_ms: int = 1000
) -> list[tuple[str, dict[str, str]]]:
    """The events of a session's ``stream`` (its :func:`stream_key`) after stream id ``after``
    (waiting up to ``block_ms`` for one)."""
    batch: Any = client.xread({stream: after}, count=100, block=block_ms)
    return [
        (as_str(eid), {as_str(k): as_str(v) for k, v in fields.items()})
        for _stream, items in batch or []
        for eid, fields in items
    ]


def follow(
    client: redis.Redis,
    stream: str,
    after: str = "0-0",
    stop: Callable[[], bool] = lambda: False,
    patience_s: float = 5.0,
    rename: Callable[[], str] | None = None,
) -> Iterator[dict[str, str]]:
    """Every event of a session's ``stream`` from ``after`` on, as it happens (in one-second
    slices). After Redis was away, ``rename()`` gives the stream's name again (a Redis that lost
    its data names it with a new secret).
    Redis restarting is ridden out (read again from the last event seen); unreachable for
    ``patience_s`` in a row, its connection error is raised (a refused password at once)."""
    down_since: float | None = None
    while not stop():
        reading_since = time.monotonic()
        try:
            batch = events(client, stream, after)
        except redis.AuthenticationError:
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            down_since = reading_since if down_since is None else down_since
            if time.monotonic() - down_since >= patience_s:
                raise
            time.sleep(OUTAGE_RETRY_S)
            continue
        if down_since is not None and rename is not None:
            stream = rename()
        down_since = None
        for entry_id, fields in batch:
            after = entry_id
            yield {"id": entry_id, **fields}
