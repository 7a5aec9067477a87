"""The per-turn discovery service in process: one admitted request and the tenant's snapshot
in, one typed reply out, with the in-memory session binder behind its port."""

from __future__ import annotations

import itertools

import pytest

from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.replies import DiscoverReply
from capdisc.discovery.service import Context, answer
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.errors import ConfigError
from capdisc.models import Capability, Visibility
from capdisc.sessions.memory import InMemorySessions
from capdisc.sessions.policy import SessionPolicy

EMBEDDER = HashingEmbedder(64)
CONFIG = DiscoveryConfig(tier1_min_relevance=-1.0, abstain_threshold=0.0)
TOOLS = [
    ("stripe-refund", "Refund a Stripe payment to a customer", ()),
    ("stripe-invoice", "Create a Stripe invoice for a customer", ()),
    ("slack-post", "Post a message to a Slack channel", ()),
    ("payroll-run", "Run the monthly payroll", ("finance",)),
]


def _snapshot() -> IndexSnapshot:
    caps = [
        Capability(
            id=f"tool:{name}",
            kind="tool",
            name=name,
            description=text,
            category=name.split("-")[0],
            visibility=Visibility(roles),
        )
        for name, text, roles in TOOLS
    ]
    vectors = EMBEDDER.embed([c.description for c in caps])
    return IndexSnapshot.build(
        "acme",
        7,
        EMBEDDER.dim,
        [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)],
        EMBEDDER.id,
    )


def _context(
    sessions: InMemorySessions | None = None, policy: SessionPolicy | None = None
) -> Context:
    policy = policy or SessionPolicy()
    return Context(
        _snapshot(),
        CachedQueryEmbedder(EMBEDDER),
        CONFIG,
        policy,
        sessions if sessions is not None else InMemorySessions(policy),
    )


def test_a_turn_gets_a_typed_reply_for_its_request() -> None:
    reply = answer(
        DiscoverRequest("refund a stripe payment", tenant="acme", request_id="r1"), _context()
    )

    assert isinstance(reply, DiscoverReply)
    assert (reply.request_id, reply.tenant, reply.index_version) == ("r1", "acme", 7)
    assert reply.ids[0] == "tool:stripe-refund"
    assert reply.session is None and reply.tools is None


def test_the_reply_survives_the_wire_unchanged() -> None:
    reply = answer(
        DiscoverRequest("refund a stripe payment", tenant="acme", tool_format="mcp", session="s1"),
        _context(),
    )

    assert DiscoverReply.from_dict(reply.to_dict()) == reply


def test_without_a_session_the_tools_are_the_matches_and_the_metatool() -> None:
    reply = answer(
        DiscoverRequest("post to slack", tenant="acme", tool_format="openai-chat", limit=1),
        _context(),
    )

    assert reply.tools is not None
    assert sorted(reply.tools.tool_names.values()) == sorted(reply.ids)
    assert reply.tools.tools[0]["function"]["name"] == "discover_capabilities"
    assert len(reply.tools.tools) == len(reply.ids) + 1


def test_in_a_session_the_tools_are_the_whole_working_set() -> None:
    context = _context()
    answer(
        DiscoverRequest("refund a stripe payment", tenant="acme", session="s1", limit=1), context
    )

    second = answer(
        DiscoverRequest(
            "post to slack", tenant="acme", session="s1", limit=1, tool_format="anthropic"
        ),
        context,
    )

    assert second.session is not None and second.tools is not None
    assert set(second.session.bound) == {"tool:stripe-refund", "tool:slack-post"}
    assert set(second.tools.tool_names.values()) >= set(second.session.bound)


def test_a_repeated_search_in_a_session_is_noted() -> None:
    context = _context()
    request = DiscoverRequest("refund a stripe payment", tenant="acme", session="s1")
    answer(request, context)

    again = answer(request, context)

    assert again.session is not None and again.session.redundant_search
    assert again.session.note


@pytest.mark.parametrize(("roles", "sees_payroll"), [((), False), (("finance",), True)])
def test_a_caller_sees_only_what_its_roles_allow(
    roles: tuple[str, ...], sees_payroll: bool
) -> None:
    reply = answer(
        DiscoverRequest("run payroll", tenant="acme", roles=list(roles), tool_format="mcp"),
        _context(),
    )

    assert ("tool:payroll-run" in reply.ids) is sees_payroll
    assert reply.tools is not None
    assert ("tool:payroll-run" in reply.tools.tool_names.values()) is sees_payroll


@pytest.mark.parametrize("cap", [8, 1])  # 1: the other caller's tool is evicted by this turn
def test_a_session_reply_lists_only_the_bound_tools_its_caller_may_see(cap: int) -> None:
    context = _context(policy=SessionPolicy(max_discovered_tools=cap))
    answer(
        DiscoverRequest("run payroll", tenant="acme", session="s1", roles=["finance"], limit=1),
        context,
    )
    shared = DiscoverRequest("post to slack", tenant="acme", session="s1", limit=1)
    anonymous = answer(shared, context)

    assert anonymous.session is not None
    assert "tool:payroll-run" not in anonymous.session.bound
    assert "tool:payroll-run" not in anonymous.session.evicted
    assert "tool:payroll-run" not in anonymous.context


def test_a_reply_says_the_time_its_turn_spent_in_the_model_and_a_cached_turn_spent_none() -> None:
    ticks = itertools.count()  # one second a reading: each model call takes 1,000 ms
    queries = CachedQueryEmbedder(EMBEDDER, clock=lambda: float(next(ticks)))
    context = Context(_snapshot(), queries, CONFIG, SessionPolicy())
    request = DiscoverRequest("refund a stripe payment", tenant="acme")

    fresh, again = answer(request, context), answer(request, context)

    assert fresh.model_ms >= 1000.0 and fresh.model_ms % 1000.0 == 0.0
    assert again.model_ms == 0.0


def test_a_bad_per_call_option_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="tier1_top_k"):
        answer(DiscoverRequest("refund", tenant="acme", options={"tier1_top_k": -1}), _context())


def test_a_turn_in_a_session_needs_a_binder() -> None:
    context = Context(_snapshot(), CachedQueryEmbedder(EMBEDDER), CONFIG, SessionPolicy())

    with pytest.raises(ValueError, match="session binder"):
        answer(DiscoverRequest("refund", tenant="acme", session="s1"), context)
