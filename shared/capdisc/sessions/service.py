"""Session operations: a turn in a session binds what it found, a recorded call runs the loop
guard, and show/export/import serve the working set. Policy is :mod:`capdisc.sessions.policy`,
storage :mod:`capdisc.sessions.store`; a request id already applied to a session returns its
first outcome and changes nothing (exactly-once effects on an at-least-once path: the storage's
compare-and-set keeps each request's outcome). Requests are read through
:class:`SessionCommand`, the fields this service needs, so sessions know nothing of discovery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import redis

from capdisc.errors import SessionNotFoundError
from capdisc.sessions import policy as policy_fns
from capdisc.sessions import store
from capdisc.sessions.policy import SessionEvent, SessionPolicy, SessionState, SessionView, Turn

Clock = Callable[[], int]
JSON = dict[str, Any]


class SessionCommand(Protocol):
    """What a session command carries (``capdisc.discovery.protocol.SessionRequest``)."""

    @property
    def op(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def session(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def tool_id(self) -> str | None: ...
    @property
    def arguments(self) -> Any: ...
    @property
    def data(self) -> Mapping[str, Any] | None: ...


def wall_ms() -> int:
    return int(time.time() * 1000)


class SessionService:
    """Session operations over one Redis connection and one policy."""

    def __init__(
        self, connection: redis.Redis, policy: SessionPolicy, clock: Clock = wall_ms
    ) -> None:
        self.redis = connection
        self.policy = policy
        self.clock = clock
        self.states = store.StateCache()

    def after_discovery(self, turn: Turn) -> SessionView:
        """Bind this turn's matches to the session and run the redundant-search guard."""
        ids = list(turn.found)
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent], JSON]:
            state = policy_fns.held_by(state, turn.holder)
            return policy_fns.after_discovery(state, ids, now, self.policy)

        outcome, ended = store.update(
            self.redis,
            turn.tenant,
            turn.session,
            change,
            self.policy,
            now,
            profile=turn.profile,
            request_id=turn.request_id,
            cache=self.states,
        )
        view = SessionView.from_outcome(outcome)
        if not ended:
            return view
        note = policy_fns.restart_note(ended, self.policy)
        return replace(view, restarted=ended, note=f"{note}; {view.note}" if view.note else note)

    def handle(
        self, request: SessionCommand, can_see: Callable[[str], bool], holder: str = ""
    ) -> JSON:
        """The reply to a call, show, export, import or watch request from ``holder``
        (:func:`capdisc.sessions.policy.holder_of`), who may change only a session of theirs
        (a call, an import); working sets shown list only what the caller ``can_see`` (a
        watcher, who reads the stream itself, must be one who may see every capability: the
        worker checks that before)."""
        if request.op == "call":
            return self._call(request, holder)
        if request.op == "watch":  # any session id: a watcher may start before the session
            return {"stream": store.stream_key(self.redis, request.tenant, request.session)}
        if request.op == "import":
            return _seen(self._import(request, holder), can_see)
        state = store.load(self.redis, request.tenant, request.session)
        if state is None:
            raise SessionNotFoundError(self._not_found(request.tenant, request.session))
        if request.op == "export":
            hidden = [i for i in [*state.bound, *state.loop_evicted] if not can_see(i)]
            return {"session": policy_fns.export(policy_fns.without(state, hidden))}
        return _seen({"working_set": policy_fns.working_set_view(state, self.policy)}, can_see)

    def _not_found(self, tenant: str, session: str) -> str:
        gone = f"session {session!r} of tenant {tenant!r}"
        why = store.ended(self.redis, tenant, session)
        if why == store.EVICTED:
            return (
                f"{gone} was dropped: it was the least recently active of more than "
                f"{self.policy.max_sessions} live sessions (the sessions' max_sessions)"
            )
        if why == store.EXPIRED:
            return (
                f"{gone} expired: it reached its maximum age of {self.policy.max_age_s:g} s "
                "(the sessions' max_age_s)"
            )
        return f"{gone} does not exist (or ended long ago)"

    def _call(self, request: SessionCommand, holder: str) -> JSON:
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent], dict[str, Any]]:
            state = policy_fns.held_by(state, holder)
            state, outcome, events = policy_fns.record_call(
                state, str(request.tool_id), request.arguments, now, self.policy
            )
            return state, events, outcome.to_dict()

        outcome, ended = store.update(
            self.redis,
            request.tenant,
            request.session,
            change,
            self.policy,
            now,
            profile=request.profile,
            request_id=request.request_id,
            cache=self.states,
        )
        if ended:
            outcome = {
                **outcome,
                "restarted": ended,
                "note": policy_fns.restart_note(ended, self.policy),
            }
        return outcome

    def _import(self, request: SessionCommand, holder: str) -> JSON:
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent], dict[str, Any]]:
            state = policy_fns.held_by(state, holder)
            fresh, events = policy_fns.imported(
                request.data or {}, request.session, now, self.policy
            )
            fresh = replace(fresh, created_ms=state.created_ms, holder=state.holder)
            return fresh, events, {"working_set": policy_fns.working_set_view(fresh, self.policy)}

        imported, _ended = store.update(
            self.redis,
            request.tenant,
            request.session,
            change,
            self.policy,
            now,
            profile=(request.data or {}).get("profile"),
            request_id=request.request_id,
            cache=self.states,
        )
        return imported


def _seen(reply: dict[str, Any], can_see: Callable[[str], bool]) -> dict[str, Any]:
    view = dict(reply["working_set"])
    view["bound"] = [b for b in view["bound"] if can_see(b["id"])]
    view["always_include"] = [i for i in view["always_include"] if can_see(i)]
    view["loop_evicted"] = [i for i in view["loop_evicted"] if can_see(i)]
    return {"working_set": view}
