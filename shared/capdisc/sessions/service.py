"""The discovery worker's session side: a turn in a session binds what it found, a recorded
call runs the loop guard, and show/export/import serve the working set. Policy is
:mod:`capdisc.sessions.policy`, storage :mod:`capdisc.sessions.store`; a request id already applied
to a
session returns its first outcome and changes nothing (exactly-once effects on an
at-least-once path: the storage's compare-and-set keeps each request's outcome).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from capdisc.access import Caller, visible
from capdisc.agents import formats
from capdisc.discovery.engine import DiscoveryResult, Match
from capdisc.discovery.protocol import DiscoverRequest, SessionRequest
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.errors import SessionNotFoundError
from capdisc.sessions import policy as policy_fns
from capdisc.sessions import store
from capdisc.sessions.policy import SessionEvent, SessionPolicy, SessionState

Clock = Callable[[], int]


def wall_ms() -> int:
    return int(time.time() * 1000)


class SessionService:
    """Session operations over one Redis connection and one policy."""

    def __init__(self, connection: redis.Redis, policy: SessionPolicy,
                 clock: Clock = wall_ms) -> None:
        self.redis = connection
        self.policy = policy
        self.clock = clock
        self.states = store.StateCache()

    def after_discovery(self, request: DiscoverRequest, result: DiscoveryResult,
                        installable: list[Match]) -> dict[str, Any]:
        """Bind this turn's matches to the session and run the redundant-search guard."""
        ids = [m.capability.id for m in result.matches]
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent],
                                                 dict[str, Any]]:
            state, bound_events = policy_fns.bind(state, ids, now, self.policy)
            state, note, search_events = policy_fns.check_search(state, ids, now, self.policy)
            outcome = {"id": state.session_id,
                       "bound": policy_fns.bound_ids(state, self.policy),
                       "added": [e.tool for e in bound_events if e.type in ("bound", "restored")],
                       "evicted": [e.tool for e in bound_events if e.type == "evicted"],
                       "redundant_search": note is not None, "note": note}
            return state, bound_events + search_events, outcome

        outcome = store.update(self.redis, request.tenant, str(request.session), change,
                               self.policy, now, profile=request.profile,
                               request_id=request.request_id, cache=self.states)
        if installable:
            outcome["installable"] = [_installable(m) for m in installable]
        return outcome

    def handle(self, request: SessionRequest, can_see: Callable[[str], bool]) -> dict[str, Any]:
        """The reply to a call, show, export or import request; working sets shown list only
        what the caller ``can_see``."""
        if request.op == "call":
            return self._call(request)
        if request.op == "import":
            return _seen(self._import(request), can_see)
        state = store.load(self.redis, request.tenant, request.session)
        if state is None:
            raise SessionNotFoundError(f"session {request.session!r} of tenant "
                                       f"{request.tenant!r} does not exist (or expired)")
        if request.op == "export":
            hidden = [i for i in state.bound if not can_see(i)]
            return {"session": policy_fns.export(policy_fns.without(state, hidden))}
        return _seen({"working_set": policy_fns.working_set_view(state, self.policy)}, can_see)

    def _call(self, request: SessionRequest) -> dict[str, Any]:
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent],
                                                 dict[str, Any]]:
            state, outcome, events = policy_fns.record_call(
                state, str(request.tool_id), request.arguments, now, self.policy)
            return state, events, outcome.to_dict()

        return store.update(self.redis, request.tenant, request.session, change, self.policy,
                            now, profile=request.profile, request_id=request.request_id,
                            cache=self.states)

    def _import(self, request: SessionRequest) -> dict[str, Any]:
        now = self.clock()

        def change(state: SessionState) -> tuple[SessionState, list[SessionEvent],
                                                 dict[str, Any]]:
            fresh, events = policy_fns.imported(request.data or {}, request.session, now,
                                                self.policy)
            fresh = replace(fresh, created_ms=state.created_ms)
            return fresh, events, {"working_set": policy_fns.working_set_view(fresh,
                                                                             self.policy)}

        return store.update(self.redis, request.tenant, request.session, change, self.policy,
                            now, profile=(request.data or {}).get("profile"),
                            request_id=request.request_id, cache=self.states)


def bound_tools(snapshot: IndexSnapshot, bound: list[str], fmt: formats.ToolFormat,
                caller: Caller) -> dict[str, Any]:
    """Tool definitions of the whole working set (what the agent should have bound now) that
    ``caller`` may see and the tenant's policy serves, in ``fmt``, plus the meta-tool."""
    caps = [snapshot.capabilities[i] for i in bound if i in snapshot.capabilities
            and visible(snapshot.capabilities[i].visibility, caller)]
    names = formats.NameMap.for_format(fmt, formats.callable_capabilities(caps))
    return {"tools": formats.list_discovered_tools(caps, fmt, snapshot.marks),
            "tool_names": {name: cap_id for cap_id, name in names.items()}}


def _seen(reply: dict[str, Any], can_see: Callable[[str], bool]) -> dict[str, Any]:
    view = dict(reply["working_set"])
    view["bound"] = [b for b in view["bound"] if can_see(b["id"])]
    view["always_include"] = [i for i in view["always_include"] if can_see(i)]
    return {"working_set": view}


def _installable(match: Match) -> dict[str, Any]:
    cap = match.capability
    entry = {"id": cap.id, "kind": cap.kind, "name": cap.name, "description": cap.description,
             "relevance": round(match.relevance, 4), "installable": True}
    if match.mark is not None:
        entry["flags"] = match.mark.to_list()
    return entry
