"""Sessions in Redis: they expire at their maximum age, the live ones are bounded, and a
concurrent writer never loses an update."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import redis

from capdisc import keys
from capdisc.discovery.protocol import SessionRequest
from capdisc.errors import SessionNotFoundError
from capdisc.sessions import policy as policy_fns
from capdisc.sessions import store
from capdisc.sessions.policy import SessionPolicy, SessionState, Turn
from capdisc.sessions.service import SessionService

from .conftest import Stack, wait_for


def _bind(tool: str, now_ms: int, policy: SessionPolicy):  # type: ignore[no-untyped-def]
    def change(state: SessionState):  # type: ignore[no-untyped-def]
        state, events = policy_fns.bind(state, [tool], now_ms, policy)
        return state, events, None

    return change


def test_a_session_expires_at_its_maximum_age(connection: redis.Redis, tenant: str) -> None:
    policy = SessionPolicy(max_age_s=60)
    now = int(connection.time()[0]) * 1000

    store.update(connection, tenant, "s1", _bind("tool:a", now, policy), policy, now)

    ttl_ms = connection.pttl(keys.session(tenant, "s1"))
    assert 0 < ttl_ms <= 60_000
    assert 0 < connection.pttl(store.stream_key(connection, tenant, "s1")) <= 60_000


def test_live_sessions_are_bounded_least_recently_active_first(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy(max_sessions=2)
    now = int(connection.time()[0]) * 1000
    for number, session in enumerate(["old", "mid", "new"]):
        store.update(
            connection, tenant, session, _bind("tool:a", now + number, policy), policy, now + number
        )

    assert store.load(connection, tenant, "old") is None
    assert store.load(connection, tenant, "mid") is not None
    assert store.load(connection, tenant, "new") is not None
    assert connection.zcard(keys.sessions(tenant)) == 2
    assert connection.xlen(store.stream_key(connection, tenant, "old")) == 1  # "ended" alone
    assert connection.exists(store.stream_key(connection, tenant, "mid"))


def test_concurrent_writers_never_lose_an_update(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy(max_discovered_tools=100)
    now = int(connection.time()[0]) * 1000
    tools = [f"tool:t{i}" for i in range(40)]

    def writer(mine: list[str]) -> None:
        client = stack.connection()
        for tool in mine:
            store.update(client, tenant, "shared", _bind(tool, now, policy), policy, now)

    threads = [threading.Thread(target=writer, args=(tools[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    state = store.load(connection, tenant, "shared")
    assert state is not None and sorted(state.bound) == sorted(tools)


def test_show_and_export_leave_out_loop_evictions_the_caller_may_not_see(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = SessionService(connection, SessionPolicy())
    for number in range(4):  # the fourth same call is a loop: the tool is evicted
        sessions.handle(
            SessionRequest("call", "s1", tenant, tool_id="tool:payroll", request_id=f"c{number}"),
            lambda _cap_id: True,
        )
    hidden = SessionRequest("show", "s1", tenant, request_id="show")

    shown = sessions.handle(hidden, lambda cap_id: cap_id != "tool:payroll")
    exported = sessions.handle(
        replace(hidden, op="export", request_id="export"), lambda cap_id: cap_id != "tool:payroll"
    )

    assert store.load(connection, tenant, "s1").loop_evicted == {"tool:payroll"}  # type: ignore[union-attr]
    assert shown["working_set"]["loop_evicted"] == []
    assert exported["session"]["loop_evicted"] == []


def test_a_writer_holding_an_expired_sessions_state_never_overwrites_its_successor(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy()
    now = int(connection.time()[0]) * 1000
    first, second = store.StateCache(), store.StateCache()  # two discovery workers
    store.update(connection, tenant, "s1", _bind("tool:a", now, policy), policy, now, cache=first)
    connection.delete(keys.session(tenant, "s1"))  # expired, or evicted among live sessions
    store.update(connection, tenant, "s1", _bind("tool:b", now, policy), policy, now, cache=second)

    store.update(connection, tenant, "s1", _bind("tool:c", now, policy), policy, now, cache=first)

    state = store.load(connection, tenant, "s1")
    assert state is not None and sorted(state.bound) == ["tool:b", "tool:c"]


def test_a_session_named_after_another_ones_event_stream_leaves_it_working(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = SessionService(connection, SessionPolicy())
    sessions.after_discovery(Turn(tenant, "s1:events", "r1", None, ["tool:a"]))

    view = sessions.after_discovery(Turn(tenant, "s1", "r2", None, ["tool:b"]))

    assert view.bound == ("tool:b",)
    streamed = connection.xrange(store.stream_key(connection, tenant, "s1"))
    assert [fields[b"tool"] for _id, fields in streamed] == [b"tool:b"]


def test_the_live_sessions_index_expires_a_maximum_age_after_its_last_session(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy(max_age_s=60)
    now = int(connection.time()[0]) * 1000

    store.update(connection, tenant, "first", _bind("tool:a", now, policy), policy, now)
    first_ms = connection.pttl(keys.sessions(tenant))
    store.update(
        connection, tenant, "later", _bind("tool:a", now + 5000, policy), policy, now + 5000
    )
    later_ms = connection.pttl(keys.sessions(tenant))
    store.update(
        connection, tenant, "first", _bind("tool:b", now + 6000, policy), policy, now + 6000
    )

    assert 60_000 < first_ms <= 120_000  # a returning agent is told its session ended
    assert first_ms + 4000 < later_ms <= 125_000
    assert connection.pttl(keys.sessions(tenant)) > first_ms + 4000  # not shortened


def session_past_its_maximum_age(connection: redis.Redis, tenant: str) -> SessionService:
    """A service whose sessions live 0.5 s, whose session "s1" (one turn) has expired."""
    sessions = SessionService(connection, SessionPolicy(max_age_s=0.5))
    sessions.after_discovery(Turn(tenant, "s1", "r1", None, ["tool:a"]))
    wait_for(lambda: not connection.exists(keys.session(tenant, "s1")), 10, "the session expiring")
    return sessions


def test_a_turn_after_a_session_reached_its_maximum_age_is_told_it_started_again(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = session_past_its_maximum_age(connection, tenant)

    view = sessions.after_discovery(Turn(tenant, "s1", "r2", None, ["tool:b"]))

    assert view.restarted == "expired"
    assert view.bound == ("tool:b",)
    assert view.note is not None and "maximum age of 0.5 s" in view.note


def one_live_session_after_dropping_old(connection: redis.Redis, tenant: str) -> SessionService:
    """A service allowing one live session per tenant, whose session "old" was dropped when
    "new" started."""
    sessions = SessionService(connection, SessionPolicy(max_sessions=1))
    sessions.after_discovery(Turn(tenant, "old", "r1", None, ["tool:a"]))
    sessions.after_discovery(Turn(tenant, "new", "r2", None, ["tool:a"]))
    return sessions


def test_a_turn_on_a_session_dropped_among_too_many_is_told_it_started_again(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = one_live_session_after_dropping_old(connection, tenant)

    view = sessions.after_discovery(Turn(tenant, "old", "r3", None, ["tool:b"]))

    assert view.restarted == "evicted"
    assert view.note is not None and "least recently active of more than 1" in view.note


def test_a_call_recorded_in_a_session_dropped_among_too_many_says_it_started_again(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = one_live_session_after_dropping_old(connection, tenant)

    outcome = sessions.handle(
        SessionRequest("call", "old", tenant, tool_id="tool:a", request_id="c1"), lambda _i: True
    )

    assert outcome["restarted"] == "evicted"


def test_a_new_sessions_first_turn_is_no_restart(connection: redis.Redis, tenant: str) -> None:
    sessions = SessionService(connection, SessionPolicy())

    first = sessions.after_discovery(Turn(tenant, "s1", "r1", None, ["tool:a"]))
    second = sessions.after_discovery(Turn(tenant, "s1", "r2", None, ["tool:b"]))

    assert (first.restarted, first.note, second.restarted) == (None, None, None)


def _events(connection: redis.Redis, tenant: str, session: str) -> list[tuple[str, str]]:
    entries = connection.xrange(store.stream_key(connection, tenant, session))
    return [(fields[b"type"].decode(), fields[b"reason"].decode()) for _id, fields in entries]


def test_a_watcher_is_told_when_its_session_is_dropped_among_too_many(
    connection: redis.Redis, tenant: str
) -> None:
    one_live_session_after_dropping_old(connection, tenant)

    assert _events(connection, tenant, "old") == [("ended", "evicted")]


def test_a_watcher_is_told_that_a_session_that_reached_its_maximum_age_started_again(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = session_past_its_maximum_age(connection, tenant)

    sessions.after_discovery(Turn(tenant, "s1", "r2", None, ["tool:b"]))

    assert _events(connection, tenant, "s1") == [("restarted", "expired"), ("bound", "")]


def test_showing_a_session_dropped_among_too_many_says_so(
    connection: redis.Redis, tenant: str
) -> None:
    sessions = one_live_session_after_dropping_old(connection, tenant)

    with pytest.raises(SessionNotFoundError, match="least recently active of more than 1"):
        sessions.handle(SessionRequest("show", "old", tenant, request_id="s"), lambda _i: True)


def test_a_writer_holding_an_old_secret_writes_the_stream_redis_names_now(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy()
    now = int(connection.time()[0]) * 1000
    writer = store.StateCache()
    store.update(connection, tenant, "s1", _bind("tool:a", now, policy), policy, now, cache=writer)
    before = store.stream_key(connection, tenant, "s1")
    connection.set(keys.SESSIONS_SECRET, "another secret")  # as after Redis lost its data

    store.update(connection, tenant, "s1", _bind("tool:b", now, policy), policy, now, cache=writer)

    after = store.stream_key(connection, tenant, "s1")
    assert after != before
    assert [f[b"tool"] for _id, f in connection.xrange(after)] == [b"tool:b"]


def _as_legacy(key: str, tenant: str) -> str:
    """The name an earlier version gave a session's key (under the tenant's registry keys)."""
    return key.replace(f"capdisc:s:{tenant}:", f"capdisc:t:{tenant}:session:", 1)


def test_sessions_kept_under_the_old_keys_move_whole_to_their_own_prefix(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy(max_age_s=600)
    now = int(connection.time()[0]) * 1000
    store.update(connection, tenant, "s:1", _bind("tool:a", now, policy), policy, now)
    current = [keys.session(tenant, "s:1"), store.stream_key(connection, tenant, "s:1")]
    for key in current:
        connection.rename(key, _as_legacy(key, tenant))

    moved = store.move_legacy_sessions(connection)

    state = store.load(connection, tenant, "s:1")
    assert moved >= 2 and state is not None and "tool:a" in state.bound
    assert all(0 < connection.pttl(key) <= 600_000 for key in current)
    assert not any(connection.exists(_as_legacy(key, tenant)) for key in current)


def test_a_session_started_again_under_its_new_key_keeps_it_over_the_old_one(
    connection: redis.Redis, tenant: str
) -> None:
    policy = SessionPolicy()
    now = int(connection.time()[0]) * 1000
    store.update(connection, tenant, "s1", _bind("tool:old", now, policy), policy, now)
    legacy = _as_legacy(keys.session(tenant, "s1"), tenant)
    connection.rename(keys.session(tenant, "s1"), legacy)
    store.update(connection, tenant, "s1", _bind("tool:new", now, policy), policy, now)

    store.move_legacy_sessions(connection)

    state = store.load(connection, tenant, "s1")
    assert state is not None and "tool:new" in state.bound and "tool:old" not in state.bound
    assert connection.exists(legacy)


def test_a_tenants_old_index_of_live_sessions_is_merged_into_the_new_one(
    connection: redis.Redis, tenant: str
) -> None:
    legacy = f"capdisc:t:{tenant}:sessions"
    connection.zadd(legacy, {"old-only": 1, "both": 5})
    connection.pexpire(legacy, 600_000)
    connection.zadd(keys.sessions(tenant), {"new-only": 3, "both": 2})

    store.move_legacy_sessions(connection)

    merged = dict(connection.zrange(keys.sessions(tenant), 0, -1, withscores=True))
    assert merged == {b"old-only": 1.0, b"new-only": 3.0, b"both": 5.0}
    assert not connection.exists(legacy)
    assert 0 < connection.pttl(keys.sessions(tenant)) <= 600_000
