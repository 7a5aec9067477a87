"""Access control: one visibility rule, and no answer, list or binding that ever shows a caller a
capability it cannot see (a property over generated registries, callers and queries), also when
the caller is whoever a signed token proves and the request claims other roles or users."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stores import STORE_PARAMS, open_store  # tests/fixtures/ is on the path

from capdisc.access import ANONYMOUS, Caller, visible
from capdisc.agents.formats import ToolFormat
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import DiscoveryResult, Query, discover, rank
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.snapshot import IndexSnapshot, store_retriever
from capdisc.discovery.tiers import tier0_text
from capdisc.discovery.toolsets import bound_tools, list_discovered_tools
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.errors import ForbiddenError, ManifestError
from capdisc.filters import SearchFilters
from capdisc.identity import auth
from capdisc.identity.gate import Gate
from capdisc.models import Capability, Relationship, Visibility
from capdisc.registry.normalize import capability_from_record
from capdisc.sessions.policy import SessionPolicy, bind, new_session
from capdisc.tokens import make_counter
from capdisc.vectorstores.port import StoredObject, VectorStore

ROLES = ["admin", "sales", "eng", "support"]
USERS = ["alice", "bob", "carol"]
WORDS = [
    "invoice",
    "refund",
    "deploy",
    "ticket",
    "weather",
    "email",
    "report",
    "database",
    "calendar",
    "payment",
    "search",
    "slack",
]
CATEGORIES = ["finance", "ops", "support", "comms"]
EMBEDDER = HashingEmbedder(64)
CONFIG = DiscoveryConfig(tier1_min_relevance=-1.0, abstain_threshold=0.0, tier1_top_k=8)


@pytest.mark.parametrize(
    ("roles", "users", "caller", "seen"),
    [
        pytest.param((), (), ANONYMOUS, True, id="open-to-the-tenant"),
        pytest.param(("sales",), (), ANONYMOUS, False, id="anonymous-sees-only-open"),
        pytest.param(("sales",), (), Caller.of(["sales", "eng"]), True, id="any-role"),
        pytest.param(("sales",), (), Caller.of(["eng"]), False, id="other-role"),
        pytest.param((), ("alice",), Caller.of([], "alice"), True, id="named-user"),
        pytest.param((), ("alice",), Caller.of(["admin"], "bob"), False, id="other-user"),
        pytest.param(("admin",), ("alice",), Caller.of([], "alice"), True, id="user-or-role"),
    ],
)
def test_visibility_rule(
    roles: tuple[str, ...], users: tuple[str, ...], caller: Caller, seen: bool
) -> None:
    assert visible(Visibility(roles, users), caller) is seen


def test_a_manifest_declares_visibility_and_bad_entries_name_the_field() -> None:
    cap = capability_from_record(
        {
            "kind": "tool",
            "name": "x",
            "description": "d",
            "visibility": {"roles": ["sales"], "users": ["alice"]},
        },
        "m",
    )
    assert cap.visibility == Visibility(("sales",), ("alice",))
    assert Capability.from_dict(cap.to_dict()).visibility == cap.visibility
    with pytest.raises(ManifestError, match=r"visibility\.groups"):
        capability_from_record(
            {"kind": "tool", "name": "x", "description": "d", "visibility": {"groups": ["a"]}}, "m"
        )


def test_open_capabilities_keep_their_content_hash() -> None:
    cap = Capability(id="tool:x", kind="tool", name="x", description="d")
    assert "visibility" not in cap.to_dict()


capabilities = st.lists(
    st.tuples(
        st.sampled_from(WORDS),
        st.sampled_from(WORDS),
        st.sampled_from(CATEGORIES),
        st.lists(st.sampled_from(ROLES), max_size=2, unique=True),
        st.lists(st.sampled_from(USERS), max_size=2, unique=True),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)
callers = st.builds(
    Caller.of,
    st.lists(st.sampled_from(ROLES), max_size=2, unique=True),
    st.one_of(st.none(), st.sampled_from(USERS)),
)
queries = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)


def _registry(rows: list[tuple[str, str, str, list[str], list[str], bool]]) -> IndexSnapshot:
    caps = [
        Capability(
            id=f"tool:{a}-{b}-{i}",
            kind="tool",
            name=f"{a}-{b}-{i}",
            description=f"{a} {b} tool number {i}",
            category=category,
            available=available,
            visibility=Visibility(tuple(roles), tuple(users)),
        )
        for i, (a, b, category, roles, users, available) in enumerate(rows)
    ]
    vectors = EMBEDDER.embed([c.description for c in caps])
    return IndexSnapshot.build(
        "t",
        1,
        EMBEDDER.dim,
        [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)],
        EMBEDDER.id,
    )


def _assert_answers_show_only(
    seen: set[str], snapshot: IndexSnapshot, caller: Caller, query: str, tool_format: ToolFormat
) -> DiscoveryResult:
    """Discovery's matches, its installable offers and its tool definitions (in
    ``tool_format``) name only capabilities in ``seen``; returns the discovery result."""
    vector = EMBEDDER.embed([query])[0]
    request = Query(query, 8, SearchFilters(caller=caller))

    result = discover(snapshot, request, vector, CONFIG)
    installable = rank(
        snapshot,
        replace(request, filters=replace(request.filters, only_installable=True)),
        vector,
        CONFIG,
        8,
    )
    tools = list_discovered_tools(result, tool_format)

    assert {m.capability.id for m in result.matches} <= seen
    assert {m.capability.id for m in installable.matches} <= seen
    assert set(tools["tool_names"].values()) <= seen
    return result


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capabilities, callers, queries)
def test_no_answer_list_or_binding_shows_an_invisible_capability(
    rows: list[tuple[str, str, str, list[str], list[str], bool]], caller: Caller, query: str
) -> None:
    snapshot = _registry(rows)
    seen = {c.id for c in snapshot.capabilities.values() if visible(c.visibility, caller)}

    result = _assert_answers_show_only(seen, snapshot, caller, query, "openai-chat")
    state, _events = bind(
        new_session("s", None, 0),
        [m.capability.id for m in result.matches],
        0,
        SessionPolicy(max_discovered_tools=50),
    )
    everything = bound_tools(snapshot, list(snapshot.capabilities), "mcp", caller).to_dict()

    assert set(state.bound) <= seen
    assert set(everything["tool_names"].values()) <= seen
    visible_caps = [c for c in snapshot.capabilities.values() if c.id in seen]
    assert result.tiers.tier0 == tier0_text(
        visible_caps, CONFIG.tier0_budget_tokens, make_counter(CONFIG.token_counter)
    )


# -- the same property through an external vector store (visibility inside its query) --------


@pytest.fixture(scope="module", params=STORE_PARAMS)
def store(request: pytest.FixtureRequest) -> Iterator[VectorStore]:
    yield from open_store(request.param)


# 150 examples: each one creates a tenant and writes its catalog through the store (about
# 55 ms on the loopback Weaviate wire); the engine-only property above runs 1,000 of the
# same draws, and this one checks that the store's own filter agrees with it.
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(capabilities, callers, queries)
def test_no_answer_through_a_vector_store_shows_an_invisible_capability(
    store: VectorStore,
    rows: list[tuple[str, str, str, list[str], list[str], bool]],
    caller: Caller,
    query: str,
) -> None:
    local = _registry(rows)
    tenant = f"t{uuid.uuid4().hex[:12]}"
    store.ensure_tenant(tenant)
    vectors = EMBEDDER.embed([c.description for c in local.capabilities.values()])
    store.upsert(
        tenant,
        [
            StoredObject.from_capability(c, v)
            for c, v in zip(local.capabilities.values(), vectors, strict=True)
        ],
    )
    snapshot = IndexSnapshot.build(
        "t",
        1,
        EMBEDDER.dim,
        [(c, v.tobytes()) for c, v in zip(local.capabilities.values(), vectors, strict=True)],
        EMBEDDER.id,
        store_retriever(store, tenant),
    )
    seen = {c.id for c in snapshot.capabilities.values() if visible(c.visibility, caller)}

    _assert_answers_show_only(seen, snapshot, caller, query, "anthropic")


# -- the same property with signed identities: what a request claims never widens its token ----

GATE_NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    path = tmp_path_factory.mktemp("keys") / "auth_keys.json"
    auth.save_keyring(path, auth.Keyring([auth.new_key(GATE_NOW)]))
    return Gate(auth.KeyringFile(path), clock=lambda: GATE_NOW)


def _keyring(gate: Gate) -> auth.Keyring:
    assert gate.keys is not None
    return gate.keys.current()


identities = st.tuples(
    st.lists(st.sampled_from(ROLES), max_size=2, unique=True),
    st.one_of(st.none(), st.sampled_from(USERS)),
)
claims = st.tuples(
    st.lists(st.sampled_from(ROLES), max_size=3, unique=True),
    st.one_of(st.none(), st.sampled_from(USERS)),
)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(capabilities, identities, claims, queries, st.booleans())
def test_no_answer_shows_a_token_holder_more_than_its_token_may_see(
    gate: Gate,
    rows: list[tuple[str, str, str, list[str], list[str], bool]],
    identity: tuple[list[str], str | None],
    claim: tuple[list[str], str | None],
    query: str,
    admin: bool,
) -> None:
    token_roles, token_user = identity
    token = auth.issue(
        _keyring(gate),
        tenant="t",
        roles=token_roles,
        user=token_user,
        ttl_s=600,
        now=GATE_NOW,
        grants=["admin"] if admin else ["discover", "session"],
    )
    claimed = DiscoverRequest(query, tenant="t", roles=claim[0], user=claim[1], token=token)
    try:
        served = gate.admit(claimed)
    except ForbiddenError:
        assert not admin  # only a claim beyond a non-admin token is refused
        return
    snapshot = _registry(rows)
    caller = Caller.of(served.roles, served.user)
    holder = caller if admin else Caller.of(token_roles, token_user)  # an admin acts as anyone
    seen = {c.id for c in snapshot.capabilities.values() if visible(c.visibility, caller)}

    _assert_answers_show_only(seen, snapshot, caller, query, "mcp")
    assert seen <= {c.id for c in snapshot.capabilities.values() if visible(c.visibility, holder)}
    assert served.token is None


@pytest.mark.parametrize("tenant", ["t", "other"])
def test_a_token_for_one_tenant_is_never_served_another(gate: Gate, tenant: str) -> None:
    token = auth.issue(_keyring(gate), tenant="t", roles=["admin"], ttl_s=600, now=GATE_NOW)
    request = DiscoverRequest("refund", tenant=tenant, token=token)

    if tenant == "t":
        assert gate.admit(request).tenant == "t"
    else:
        with pytest.raises(ForbiddenError, match="wrong tenant") as refused:
            gate.admit(request)
        assert refused.value.reason == "wrong_tenant"  # what the worker's log says


@pytest.mark.parametrize(
    ("claimed", "reason"),
    [
        (DiscoverRequest("refund", tenant="t", session="s1"), "grant"),
        (DiscoverRequest("refund", tenant="t", roles=["finance"]), "roles"),
        (DiscoverRequest("refund", tenant="t", user="mallory"), "user"),
    ],
)
def test_a_refusal_names_what_the_token_does_not_allow(
    gate: Gate, claimed: DiscoverRequest, reason: str
) -> None:
    token = auth.issue(
        _keyring(gate),
        tenant="t",
        roles=["hr"],
        user="alice",
        grants=["discover"],
        ttl_s=600,
        now=GATE_NOW,
    )

    with pytest.raises(ForbiddenError) as refused:
        gate.admit(replace(claimed, token=token))

    assert refused.value.reason == reason


# -- graph re-ranking pulls in related capabilities: only those the query's filters admit -------


@pytest.mark.parametrize(
    ("caller", "pulled_in"),
    [
        pytest.param(ANONYMOUS, False, id="anonymous-never-sees-the-restricted-dependency"),
        pytest.param(Caller.of(["hr"]), True, id="its-role-gets-it-pulled-in"),
    ],
)
def test_graph_reranking_never_pulls_in_what_the_caller_may_not_see(
    caller: Caller, pulled_in: bool
) -> None:
    caps = [
        Capability(
            id="tool:payslip",
            kind="tool",
            name="payslip",
            description="Send an employee their payslip",
            relationships=(Relationship("tool:salaries", "depends_on"),),
        ),
        Capability(
            id="tool:salaries",
            kind="tool",
            name="salaries",
            description="Read the salary table",
            visibility=Visibility(("hr",)),
        ),
    ]
    vectors = EMBEDDER.embed([c.description for c in caps])
    snapshot = IndexSnapshot.build(
        "t",
        1,
        EMBEDDER.dim,
        [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)],
        EMBEDDER.id,
    )
    config = CONFIG.merged({"use_graph_reranking": True, "graph_boost_factor": 1.0})
    query = "send an employee their payslip"

    result = discover(
        snapshot,
        Query(query, 5, SearchFilters(kind="tool", caller=caller)),
        EMBEDDER.embed([query])[0],
        config,
    )

    assert ("tool:salaries" in [m.capability.id for m in result.matches]) is pulled_in
