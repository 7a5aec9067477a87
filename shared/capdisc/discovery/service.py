"""The per-turn discovery policy: one request in, one typed reply out.

:func:`answer` is what a discovery worker does with a checked, admitted request once it has
the tenant's snapshot: apply the agent profile and per-call options to the configuration,
embed the query (with the sub-queries decomposition will ask for, in one model pass), rank and
assemble the tiers (:func:`capdisc.discovery.engine.discover`), bind the matches to the
session when the turn is in one (offering installable capabilities when few available ones
fit), and add the tool definitions of the requested format. It does no I/O of its own: the
query embedder and the session binder are ports, so the worker, the benchmarks and the tests
all run this same function (the worker with Redis behind the ports, tests with in-memory
ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from capdisc.access import Caller, visible
from capdisc.agents.formats import ToolFormat
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import DiscoveryResult, Match, Query, discover, embed_turn, rank
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.replies import CapabilityView, DiscoverReply, Tiers, ToolBundle
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.discovery.toolsets import bound_tools, tool_bundle
from capdisc.embedders.port import CachedQueryEmbedder, Vector
from capdisc.filters import SearchFilters
from capdisc.sessions.policy import SessionPolicy, SessionView, Turn, allowed_ids, holder_of

#: Installable capabilities offered at most, when few available ones fit.
INSTALLABLE_OFFERED = 3


class SessionBinder(Protocol):
    """Port: binds a turn's matches to its session (Redis in the worker:
    :class:`capdisc.sessions.service.SessionService`)."""

    def after_discovery(self, turn: Turn) -> SessionView: ...


@dataclass(frozen=True)
class Context:
    """Everything a turn is answered with besides its request."""

    snapshot: IndexSnapshot
    queries: CachedQueryEmbedder
    discovery: DiscoveryConfig
    sessions: SessionPolicy
    #: Binds matches to sessions; None: a request in a session cannot be answered here.
    binder: SessionBinder | None = None


def answer(request: DiscoverRequest, context: Context) -> DiscoverReply:
    """The reply to ``request`` (already admitted: its roles and user are who asks).
    :class:`~capdisc.errors.CapdiscError` for a bad per-call option, a failed embedding or a
    session that cannot be bound. The reply says how much of the turn was the query model."""
    context.queries.take_model_ms()  # this turn's model time counts from here
    profile = context.sessions.named_profile(request.profile)
    config = context.discovery.merged({**profile.options, **request.options})
    vector, embed = embed_turn(context.queries, request.query, config)
    query = query_for(request, context.sessions)
    result = discover(context.snapshot, query, vector, config, embed)
    session = _bind(request, context, query, result, vector, config)
    reply = reply_for(
        request.request_id,
        result,
        session,
        _tools(request, context.snapshot, result, session, query),
    )
    return reply.with_model_time(context.queries.take_model_ms())


def query_for(request: DiscoverRequest, policy: SessionPolicy) -> Query:
    """The request's query; in a session or for a profile, limited to the profile's
    allowlist, its expert tools first, and (in a session) to available capabilities."""
    filters = SearchFilters(
        kind=request.kind,
        category=request.category,
        tags=tuple(request.tags),
        only_available=request.only_available or bool(request.session),
        include_ids=allowed_ids(policy, request.profile),
        caller=Caller.of(request.roles, request.user),
    )
    experts = frozenset(policy.profile(request.profile).expert_tools)
    return Query(request.query, request.limit, filters, prefer=experts)


def installable(
    snapshot: IndexSnapshot,
    query: Query,
    result: DiscoveryResult,
    vector: Vector,
    config: DiscoveryConfig,
    below: int,
) -> list[Match]:
    """When fewer than ``below`` available capabilities fit, the best ones not available yet
    (offered apart from the matches, for the platform to install)."""
    if len(result.matches) >= below or not snapshot.has_installable:
        return []
    wanted = replace(
        query, filters=replace(query.filters, only_available=False, only_installable=True)
    )
    return list(rank(snapshot, wanted, vector, config, INSTALLABLE_OFFERED).matches)


def _bind(
    request: DiscoverRequest,
    context: Context,
    query: Query,
    result: DiscoveryResult,
    vector: Vector,
    config: DiscoveryConfig,
) -> SessionView | None:
    if not request.session:
        return None
    if context.binder is None:
        raise ValueError("a request in a session needs a session binder")
    view = context.binder.after_discovery(
        Turn(
            request.tenant,
            request.session,
            request.request_id,
            request.profile,
            [m.capability.id for m in result.matches],
            holder_of(request.roles, request.user),
        )
    )
    view = _seen_by(view, context.snapshot, query.filters.caller)
    offers = installable(
        context.snapshot,
        query,
        result,
        vector,
        config,
        context.sessions.installable_for(request.profile),
    )
    if not offers:
        return view
    return replace(view, installable=tuple(_offer(m) for m in offers))


def _seen_by(view: SessionView, snapshot: IndexSnapshot, caller: Caller) -> SessionView:
    """``view`` with only the capabilities ``caller`` may see: a session's working set can hold
    tools another caller bound, or ones whose visibility narrowed (or that were deleted) since."""

    def shown(cap_id: str) -> bool:
        cap = snapshot.capabilities.get(cap_id)
        return cap is not None and visible(cap.visibility, caller)

    return replace(
        view,
        bound=tuple(i for i in view.bound if shown(i)),
        evicted=tuple(i for i in view.evicted if shown(i)),
    )


def _offer(match: Match) -> dict[str, Any]:
    """An installable capability as a session view lists it."""
    cap = match.capability
    entry = {
        "id": cap.id,
        "kind": cap.kind,
        "name": cap.name,
        "description": cap.description,
        "relevance": round(match.relevance, 4),
        "installable": True,
    }
    if match.mark is not None:
        entry["flags"] = match.mark.to_list()
    return entry


def _tools(
    request: DiscoverRequest,
    snapshot: IndexSnapshot,
    result: DiscoveryResult,
    session: SessionView | None,
    query: Query,
) -> ToolBundle | None:
    """With a tool format: the matches' definitions, or in a session its whole working set."""
    if request.tool_format is None:
        return None
    fmt = cast(ToolFormat, request.tool_format)  # checked when the request was decoded
    if session is not None:
        return bound_tools(snapshot, session.bound, fmt, query.filters.caller)
    marks = {m.capability.id: m.mark for m in result.matches if m.mark is not None}
    return tool_bundle([m.capability for m in result.matches], fmt, marks)


def reply_for(
    request_id: str,
    result: DiscoveryResult,
    session: SessionView | None = None,
    tools: ToolBundle | None = None,
) -> DiscoverReply:
    """The reply to a turn that found ``result``."""
    tiers = result.tiers
    return DiscoverReply(
        request_id=request_id,
        query=result.query,
        tenant=result.tenant,
        index_version=result.index_version,
        abstained=result.abstained,
        capabilities=tuple(view_of(m) for m in result.matches),
        tiers=Tiers(tiers.tier0, tiers.tier1, tiers.tier2),
        tokens=dict(tiers.tokens),
        total_indexed=result.total_indexed,
        workflow_hints=dict(result.workflow_hints),
        session=session,
        tools=tools,
    )


def view_of(match: Match) -> CapabilityView:
    """One match as a reply carries it."""
    cap = match.capability
    return CapabilityView(
        id=cap.id,
        kind=cap.kind,
        name=cap.name,
        display_name=cap.display_name,
        description=cap.description,
        category=cap.category,
        available=cap.available,
        score=round(match.score, 4),
        relevance=round(match.relevance, 4),
        tier=match.tier,
        reason=match.reason or None,
        flags=tuple(match.mark.to_list()) if match.mark is not None else None,
    )
