"""Session policy (docs/design.md, "Sessions"): the working set, the loop guard and the
redundant-search guard, as pure functions over an immutable :class:`SessionState`.

Every function takes the state, the time (``now_ms``, from the caller's clock) and the policy,
and returns the new state with the :class:`SessionEvent` list that says what changed. Nothing
here does I/O: :mod:`capdisc.sessions.store` stores states and events in Redis.

- **Working set**: discovered capabilities with first-seen, last-used and use count, at most
  ``max_discovered_tools`` of them; always-include tools never count and are never evicted;
  over capacity, tools unused for ``tool_ttl_s`` go first, then the least recently used.
  Binding an already-bound tool refreshes it without a duplicate.
- **Loop guard**: each call is keyed by tool and a hash of its normalized arguments; a key seen
  more than ``loop_max_repeats`` times within ``loop_window_s``, or more than
  ``loop_max_in_recent`` times among the last ``loop_recent_calls`` calls (which catches
  A, B, A, B alternation), is a loop. The call still counts as executed; the tool is evicted
  (eviction, not blocking) with guidance; discovering it again restores it and resets its count.
- **Redundant-search guard**: a search whose results overlap a recent one's by at least
  ``redundant_overlap`` still answers, with a note that those tools are already bound.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from capdisc.durations import bounded_duration
from capdisc.errors import ForbiddenError, UnknownProfileError
from capdisc.sessions.views import SessionView as SessionView

JSON = dict[str, Any]

GENERIC_LOOP_GUIDANCE = (
    "This tool was called repeatedly with the same arguments without progress, so it was "
    "removed from your tools. The call above did run. Rethink the approach; if you still need "
    "a capability, call discover_capabilities with a more specific request."
)
REDUNDANT_SEARCH_NOTE = (
    "These tools are already bound from a recent search; use them, or search with a more "
    "specific request if you need different ones."
)


class AgentProfile(BaseModel):
    """One kind of agent (an "expert"): what it may discover,
    which tools rank first, its own always-include set, cap and per-turn discovery options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Only these capability ids can be discovered (None: any).
    allowlist: list[str] | None = None
    #: Ranked first whenever they are among the results.
    expert_tools: list[str] = Field(default_factory=list)
    always_include: list[str] = Field(default_factory=list)
    max_discovered_tools: int | None = Field(None, ge=1)
    #: Offer installable capabilities when fewer results than this fit (None: the platform's).
    installable_below: int | None = Field(None, ge=0)
    #: Discovery options for this profile's turns (budgets, top-k, ...), under per-call ones.
    options: dict[str, Any] = Field(default_factory=dict)


#: The profile of a request that names none (or one not configured): no restriction.
NO_PROFILE = AgentProfile()


class SessionPolicy(BaseModel):
    """The knobs of sessions, loop and redundant-search guards, and agent profiles."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_discovered_tools: int = Field(8, ge=1)
    tool_ttl_s: float = Field(1800.0, gt=0)
    max_age_s: float = Field(86400.0, gt=0)
    max_sessions: int = Field(10_000, ge=1)
    always_include: list[str] = Field(default_factory=list)
    loop_window_s: float = Field(60.0, gt=0)
    loop_max_repeats: int = Field(3, ge=1)
    loop_recent_calls: int = Field(8, ge=2)
    loop_max_in_recent: int = Field(3, ge=1)
    loop_exempt_tools: list[str] = Field(default_factory=list)
    #: tool id -> what to try instead when it loops (the loop guard's guidance for that tool)
    loop_guidance: dict[str, str] = Field(default_factory=dict)
    redundant_overlap: float = Field(0.8, gt=0, le=1)
    redundant_window_s: float = Field(300.0, gt=0)
    redundant_history: int = Field(5, ge=1)
    #: Offer installable (not yet available) capabilities, apart from the matches, when fewer
    #: results than this fit (docs/design.md, "Installable offers"). Off by default: each such
    #: turn costs a second search; 1 offers them when nothing available fits.
    installable_below: int = Field(0, ge=0)
    #: How long a request's outcome is kept, so a retried or redelivered request (a client
    #: re-sending, a worker reclaiming a dead one's) changes the session once.
    request_memory_s: float = Field(600.0, gt=0)
    profiles: dict[str, AgentProfile] = Field(default_factory=dict)

    _bounded_duration = field_validator("*")(bounded_duration)

    def profile(self, name: str | None) -> AgentProfile:
        return self.profiles.get(name or "", NO_PROFILE)

    def named_profile(self, name: str | None) -> AgentProfile:
        """The profile a request names (none named: no profile); one not configured is an
        :class:`~capdisc.errors.UnknownProfileError`, so that a misspelt name is not served
        without the restrictions it stands for. (A session keeps the profile it started
        with: :meth:`profile` serves one since taken out of the settings as no profile.)"""
        if name and name not in self.profiles:
            configured = ", ".join(repr(p) for p in sorted(self.profiles)) or "none"
            raise UnknownProfileError(
                f"profile {name!r} is not configured in the discovery workers' settings "
                f"(sessions.profiles; configured: {configured}): check the name, or leave the "
                "profile out"
            )
        return self.profile(name)

    def installable_for(self, profile: str | None) -> int:
        below = self.profile(profile).installable_below
        return self.installable_below if below is None else below

    def cap_for(self, profile: str | None) -> int:
        return self.profile(profile).max_discovered_tools or self.max_discovered_tools

    def always_for(self, profile: str | None) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.always_include, *self.profile(profile).always_include]))


@dataclass(frozen=True)
class Bound:
    """One discovered capability in a working set."""

    first_seen_ms: int
    last_used_ms: int
    use_count: int = 0


@dataclass(frozen=True)
class SessionEvent:
    """One change to a working set (``bound``, ``refreshed``, ``evicted``, ``restored``,
    ``loop_detected``, ``redundant_search``, ``imported``; :mod:`capdisc.sessions.store` adds
    ``ended`` and ``restarted``, whose reason is why it ended). ``tool`` names the capability; a
    ``refreshed`` event lists all the tools one discovery found again, comma-separated."""

    type: str
    at_ms: int
    tool: str = ""
    reason: str = ""

    def to_fields(self) -> dict[str, str]:
        return {
            "type": self.type,
            "at_ms": str(self.at_ms),
            "tool": self.tool,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class SessionState:
    """A session's working set and guard memory (stored as JSON)."""

    session_id: str
    profile: str | None
    created_ms: int
    bound: Mapping[str, Bound] = field(default_factory=dict)
    #: Recent calls, oldest first: (tool, argument hash, at_ms).
    calls: tuple[tuple[str, str, int], ...] = ()
    #: Recent searches, oldest first: (at_ms, result ids).
    searches: tuple[tuple[int, tuple[str, ...]], ...] = ()
    #: Tools the loop guard evicted, until a discovery finds them again.
    loop_evicted: frozenset[str] = frozenset()
    #: Who the session serves (:func:`holder_of` its starter; "": a session stored before
    #: sessions had holders, taken by the next caller).
    holder: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "profile": self.profile,
            "created_ms": self.created_ms,
            "bound": {
                k: [b.first_seen_ms, b.last_used_ms, b.use_count] for k, b in self.bound.items()
            },
            "calls": [list(c) for c in self.calls],
            "searches": [[at, list(ids)] for at, ids in self.searches],
            "loop_evicted": sorted(self.loop_evicted),
            "holder": self.holder,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionState:
        return cls(
            session_id=str(data["session_id"]),
            profile=data.get("profile"),
            created_ms=int(data["created_ms"]),
            bound={
                k: Bound(int(v[0]), int(v[1]), int(v[2])) for k, v in data.get("bound", {}).items()
            },
            calls=tuple((str(t), str(h), int(at)) for t, h, at in data.get("calls", [])),
            searches=tuple((int(at), tuple(ids)) for at, ids in data.get("searches", [])),
            loop_evicted=frozenset(data.get("loop_evicted", [])),
            holder=str(data.get("holder") or ""),
        )


def new_session(session_id: str, profile: str | None, now_ms: int) -> SessionState:
    return SessionState(session_id=session_id, profile=profile, created_ms=now_ms)


# -- whose session ------------------------------------------------------------------------------


def holder_of(roles: Iterable[str], user: str | None) -> str:
    """Whose a session is: the roles and user a caller asks with, which decide what it may
    see. Callers who see the same capabilities share sessions (every anonymous caller of a
    tenant, with auth off); one with other roles or another user may look at a session (what
    it may see of it) but not change it, so cannot evict what it may not see or learn from a
    call's outcome that it is bound there."""
    return json.dumps([sorted(set(roles)), user or ""], separators=(",", ":"))


def held_by(state: SessionState, holder: str) -> SessionState:
    """``state`` as ``holder`` may use it: the session is theirs (a session of no holder yet,
    stored before sessions had holders, becomes theirs); another holder's is refused."""
    if state.holder == holder:
        return state
    if not state.holder:
        return replace(state, holder=holder)
    raise ForbiddenError(
        f"session {state.session_id!r} was started by a caller with other roles or another "
        "user than yours, and only callers who may see what its starter sees may change it "
        "(you may show or export what you can see of it): use a session id of your own",
        "session",
    )


# -- the working set -----------------------------------------------------------------------------


def bind(
    state: SessionState, ids: Sequence[str], now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, list[SessionEvent]]:
    """Bind the capabilities a discovery found (best first): new ones are added, bound ones
    refreshed, loop-evicted ones restored with their count reset; then evict to the cap."""
    always = set(policy.always_for(state.profile))
    bound = dict(state.bound)
    events: list[SessionEvent] = []
    restored = {i for i in ids if i in state.loop_evicted}
    refreshed = []
    for cap_id in dict.fromkeys(ids):
        if cap_id in always:
            continue
        if cap_id in bound:
            bound[cap_id] = replace(bound[cap_id], last_used_ms=now_ms)
            refreshed.append(cap_id)
        else:
            bound[cap_id] = Bound(now_ms, now_ms)
            kind = "restored" if cap_id in restored else "bound"
            events.append(
                SessionEvent(
                    kind, now_ms, cap_id, "found again by a discovery" if kind == "restored" else ""
                )
            )
    if refreshed:  # one event for all the tools found again (their order: the ranking's)
        events.insert(0, SessionEvent("refreshed", now_ms, ",".join(refreshed)))
    calls = tuple(c for c in state.calls if c[0] not in restored)
    state = replace(state, bound=bound, calls=calls, loop_evicted=state.loop_evicted - restored)
    rank = {cap_id: position for position, cap_id in enumerate(ids)}
    return _evict_to_cap(state, now_ms, policy, rank, events)


def _evict_to_cap(
    state: SessionState,
    now_ms: int,
    policy: SessionPolicy,
    rank: Mapping[str, int],
    events: list[SessionEvent],
) -> tuple[SessionState, list[SessionEvent]]:
    """Over the cap: first the tools unused for ``tool_ttl_s``, then the least recently used
    (among equally recent, the lower ranked by the discovery that bound them)."""
    cap = policy.cap_for(state.profile)
    bound = dict(state.bound)
    if len(bound) > cap:
        stale = [k for k, b in bound.items() if now_ms - b.last_used_ms > policy.tool_ttl_s * 1000]
        for cap_id in sorted(stale, key=lambda k: bound[k].last_used_ms)[: len(bound) - cap]:
            del bound[cap_id]
            events.append(SessionEvent("evicted", now_ms, cap_id, "ttl"))
    if len(bound) > cap:
        order = sorted(bound, key=lambda k: (bound[k].last_used_ms, -rank.get(k, -1)))
        for cap_id in order[: len(bound) - cap]:
            del bound[cap_id]
            events.append(SessionEvent("evicted", now_ms, cap_id, "lru"))
    return replace(state, bound=bound), events


def bound_ids(state: SessionState, policy: SessionPolicy) -> list[str]:
    """Always-include tools first, then the discovered ones, most recently used first."""
    discovered = sorted(state.bound, key=lambda k: -state.bound[k].last_used_ms)
    return list(dict.fromkeys([*policy.always_for(state.profile), *discovered]))


# -- the loop guard ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallOutcome:
    """What recording one executed tool call did."""

    tool_id: str
    loop_detected: bool = False
    evicted: bool = False
    guidance: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool_id": self.tool_id,
            "loop_detected": self.loop_detected,
            "evicted": self.evicted,
            "guidance": self.guidance,
        }


def record_call(
    state: SessionState, tool_id: str, arguments: Any, now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, CallOutcome, list[SessionEvent]]:
    """Record an executed call. It always counts; a loop evicts the tool (unless it is an
    always-include tool) and returns guidance. Exempt tools are never loop-checked."""
    bound = dict(state.bound)
    if tool_id in bound:
        entry = bound[tool_id]
        bound[tool_id] = replace(entry, last_used_ms=now_ms, use_count=entry.use_count + 1)
    state = replace(state, bound=bound)
    if tool_id in policy.loop_exempt_tools:
        return state, CallOutcome(tool_id), []
    digest = argument_hash(arguments)
    horizon = now_ms - int(policy.loop_window_s * 1000)
    calls = (*_kept_calls(state.calls, horizon, policy), (tool_id, digest, now_ms))
    state = replace(state, calls=calls)
    if not _is_loop(calls, tool_id, digest, horizon, policy):
        return state, CallOutcome(tool_id), []
    return _break_loop(state, tool_id, now_ms, policy)


def _kept_calls(
    calls: Sequence[tuple[str, str, int]], horizon: int, policy: SessionPolicy
) -> list[tuple[str, str, int]]:
    """The calls either guard still needs: those in the time window and the most recent ones
    (the sliding window counts them however old), at most a bounded number."""
    recent_from = len(calls) - policy.loop_recent_calls
    kept = [c for i, c in enumerate(calls) if c[2] >= horizon or i >= recent_from]
    return kept[-(policy.loop_max_repeats + 1) * 16 :]


def _is_loop(
    calls: Sequence[tuple[str, str, int]],
    tool_id: str,
    digest: str,
    horizon: int,
    policy: SessionPolicy,
) -> bool:
    in_window = sum(1 for t, h, at in calls if (t, h) == (tool_id, digest) and at >= horizon)
    recent = calls[-policy.loop_recent_calls :]
    in_recent = sum(1 for t, h, _at in recent if (t, h) == (tool_id, digest))
    return in_window > policy.loop_max_repeats or in_recent > policy.loop_max_in_recent


def _break_loop(
    state: SessionState, tool_id: str, now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, CallOutcome, list[SessionEvent]]:
    guidance = policy.loop_guidance.get(tool_id) or GENERIC_LOOP_GUIDANCE
    events = [SessionEvent("loop_detected", now_ms, tool_id, "repeated calls")]
    always = tool_id in policy.always_for(state.profile)
    if always:
        return state, CallOutcome(tool_id, True, False, guidance), events
    bound = {k: v for k, v in state.bound.items() if k != tool_id}
    evicted = tool_id in state.bound
    if evicted:
        events.append(SessionEvent("evicted", now_ms, tool_id, "loop"))
    state = replace(state, bound=bound, loop_evicted=state.loop_evicted | {tool_id})
    return state, CallOutcome(tool_id, True, evicted, guidance), events


_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def argument_hash(arguments: Any) -> str:
    """A short hash of ``arguments`` after normalization: keys sorted, strings trimmed, URLs
    with a lowercase scheme and host, no fragment, no trailing slash and sorted query
    parameters (variations that name the same resource hash alike)."""
    canonical = json.dumps(
        _normalized(arguments),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def _normalized(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        return _normalized_url(text) if _URL.match(text) else text
    if isinstance(value, Mapping):
        return {str(k): _normalized(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalized(v) for v in value]
    return value


def _normalized_url(url: str) -> str:
    parts = urlsplit(url)
    query = "&".join(sorted(p for p in parts.query.split("&") if p))
    return urlunsplit(
        (parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), query, "")
    )


# -- the redundant-search guard --------------------------------------------------------------------


def check_search(
    state: SessionState, ids: Sequence[str], now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, str | None, list[SessionEvent]]:
    """Remember this search; a note when its results overlap a recent search's by at least
    ``redundant_overlap`` (the search still answers: the note only nudges)."""
    horizon = now_ms - int(policy.redundant_window_s * 1000)
    recent = [s for s in state.searches if s[0] >= horizon]
    found = set(ids)
    redundant = bool(found) and any(
        len(found & set(previous)) / len(found) >= policy.redundant_overlap
        for _at, previous in recent
    )
    searches = (*recent, (now_ms, tuple(ids)))[-policy.redundant_history :]
    state = replace(state, searches=searches)
    if not redundant:
        return state, None, []
    return (
        state,
        REDUNDANT_SEARCH_NOTE,
        [SessionEvent("redundant_search", now_ms, "", ",".join(ids))],
    )


# -- export and import -----------------------------------------------------------------------------


def after_discovery(
    state: SessionState, ids: Sequence[str], now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, list[SessionEvent], JSON]:
    """A discovery turn in the session: bind its matches ``ids`` and run the redundant-search
    guard; the new state, its events and the outcome (:meth:`SessionView.from_outcome`)."""
    state, bound_events = bind(state, ids, now_ms, policy)
    state, note, search_events = check_search(state, ids, now_ms, policy)
    outcome = {
        "id": state.session_id,
        "bound": bound_ids(state, policy),
        "added": [e.tool for e in bound_events if e.type in ("bound", "restored")],
        "evicted": [e.tool for e in bound_events if e.type == "evicted"],
        "redundant_search": note is not None,
        "note": note,
    }
    return state, bound_events + search_events, outcome


def restart_note(ended: str, policy: SessionPolicy) -> str:
    """What an agent is told on the turn that started its session again: why the session's
    earlier life ended (``ended``: :data:`capdisc.sessions.store.EXPIRED` or ``EVICTED``), and
    that the tools bound before are gone."""
    why = (
        f"it was the least recently active of more than {policy.max_sessions} live sessions"
        if ended == "evicted"
        else f"it reached its maximum age of {policy.max_age_s:g} s"
    )
    return (
        f"this session had ended ({why}), so this turn started it again with an empty "
        "working set: tools bound before are no longer bound; discover them again if needed"
    )


def imported(
    data: Mapping[str, Any], session_id: str, now_ms: int, policy: SessionPolicy
) -> tuple[SessionState, list[SessionEvent]]:
    """A session made from an export: the same working set under ``session_id`` (guard memory
    is not carried: the importing agent starts its own)."""
    source = SessionState.from_dict({**data, "session_id": session_id})
    state = new_session(session_id, source.profile, now_ms)
    state = replace(state, bound=dict(source.bound), loop_evicted=source.loop_evicted)
    state, events = _evict_to_cap(state, now_ms, policy, {}, [])
    return state, [SessionEvent("imported", now_ms, "", f"{len(state.bound)} tools"), *events]


def without(state: SessionState, ids: Iterable[str]) -> SessionState:
    """``state`` with ``ids`` left out of the working set and the loop guard's evictions
    (what a caller may not see)."""
    gone = set(ids)
    return replace(
        state,
        bound={k: v for k, v in state.bound.items() if k not in gone},
        loop_evicted=state.loop_evicted - gone,
    )


def export(state: SessionState) -> dict[str, Any]:
    """What :func:`imported` needs: the working set, without guard memory."""
    data = state.to_dict()
    return {k: data[k] for k in ("session_id", "profile", "created_ms", "bound", "loop_evicted")}


def working_set_view(state: SessionState, policy: SessionPolicy) -> dict[str, Any]:
    """The working set as shown to people and clients."""
    return {
        "session": state.session_id,
        "profile": state.profile,
        "created_ms": state.created_ms,
        "bound": [
            {
                "id": k,
                "first_seen_ms": b.first_seen_ms,
                "last_used_ms": b.last_used_ms,
                "use_count": b.use_count,
            }
            for k, b in sorted(state.bound.items(), key=lambda kv: -kv[1].last_used_ms)
        ],
        "always_include": list(policy.always_for(state.profile)),
        "loop_evicted": sorted(state.loop_evicted),
    }


def allowed_ids(policy: SessionPolicy, profile: str | None) -> frozenset[str] | None:
    allow = policy.profile(profile).allowlist
    return frozenset(allow) if allow is not None else None


def experts_first(ids: Iterable[str], policy: SessionPolicy, profile: str | None) -> list[str]:
    """``ids`` with the profile's expert tools moved to the front (their order kept)."""
    experts = set(policy.profile(profile).expert_tools)
    ordered = list(ids)
    return [i for i in ordered if i in experts] + [i for i in ordered if i not in experts]


# -- a discovery turn in a session ---------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """A discovery turn in a session: where, as which request, and what it found."""

    tenant: str
    session: str
    request_id: str
    profile: str | None
    found: Sequence[str]
    #: Who asks (:func:`holder_of`).
    holder: str = ""
