"""The vector-store contract: every :class:`~capdisc.vectorstores.port.VectorStore` behaves the
same.

Run on three stores:

- ``memory``: :class:`~capdisc.vectorstores.port.InMemoryVectorStore`, always;
- ``weaviate-wire``: :class:`~capdisc.vectorstores.weaviate.WeaviateVectorStore` through the real
  ``weaviate-client`` against the fake Weaviate on loopback (``tests/fixtures/fake_weaviate.py``),
  always: it checks that the filters the adapter sends mean what the contract says;
- ``weaviate-live``: the same adapter against a real server, when ``CAPDISC_WEAVIATE_URL`` is set
  (with ``CAPDISC_WEAVIATE_GRPC_PORT`` and ``CAPDISC_WEAVIATE_API_KEY`` as needed); each run uses
  a collection of its own and deletes it afterwards.

Each test gets tenants of its own, so tests never see each other's objects.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stores import STORE_PARAMS, open_store  # tests/fixtures/ is on the path

from capdisc.access import Caller, visible
from capdisc.errors import UnknownTenantError, VectorStoreError
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Kind, Visibility
from capdisc.retrieval.index import RetrievalIndex
from capdisc.vectorstores.port import (
    StoredObject,
    StoreHit,
    VectorStore,
    relative_score_fusion,
)

DIM = 8


@pytest.fixture(scope="module", params=STORE_PARAMS)
def store(request: pytest.FixtureRequest) -> Iterator[VectorStore]:
    yield from open_store(request.param)


def new_tenant(store: VectorStore) -> str:
    name = f"t{uuid.uuid4().hex[:12]}"
    store.ensure_tenant(name)
    return name


@pytest.fixture
def tenant(store: VectorStore) -> str:
    return new_tenant(store)


def vec(*head: float) -> np.ndarray:
    """A DIM-dimensional vector starting with ``head`` (the rest a small constant)."""
    out = np.full(DIM, 0.01, dtype=np.float32)
    out[: len(head)] = head
    return out


def obj(key: str, vector: np.ndarray | None = None, **fields: Any) -> StoredObject:
    return StoredObject(
        key, vec(1.0) if vector is None else vector, **{"text": f"capability {key}", **fields}
    )


def ids(hits: list[StoreHit]) -> list[str]:
    return [h.id for h in hits]


def search(
    store: VectorStore,
    tenant: str,
    k: int = 10,
    *,
    query: str = "",
    vector: np.ndarray | None = None,
    alpha: float = 1.0,
    roles: tuple[str, ...] = (),
    user: str | None = None,
    **filters: Any,
) -> list[StoreHit]:
    """A search with ``SearchFilters(**filters)``, asked by the caller of ``roles`` and
    ``user``."""
    return store.search(
        tenant,
        query,
        vec(1.0) if vector is None else vector,
        k,
        alpha=alpha,
        filters=SearchFilters(caller=Caller.of(roles, user), **filters),
    )


# -- writes ----------------------------------------------------------------------------------------


def test_upsert_writes_and_counts(store: VectorStore, tenant: str) -> None:
    report = store.upsert(tenant, [obj("tool:a"), obj("tool:b")])

    assert report.ok and set(report.written) == {"tool:a", "tool:b"}
    assert store.count(tenant) == 2
    assert set(ids(search(store, tenant))) == {"tool:a", "tool:b"}


def test_upsert_is_idempotent(store: VectorStore, tenant: str) -> None:
    objects = [obj("tool:a", vec(1, 0)), obj("tool:b", vec(0, 1))]
    store.upsert(tenant, objects)
    first = search(store, tenant, vector=vec(1, 0.2))

    again = store.upsert(tenant, objects)

    assert again.ok and store.count(tenant) == 2
    assert ids(search(store, tenant, vector=vec(1, 0.2))) == ids(first)


def test_a_rewrite_replaces_the_object(store: VectorStore, tenant: str) -> None:
    store.upsert(tenant, [obj("tool:a", category="old")])
    store.upsert(tenant, [obj("tool:a", category="new")])

    assert store.count(tenant) == 1
    assert search(store, tenant, category="old") == []
    assert ids(search(store, tenant, category="new")) == ["tool:a"]


def test_a_repeated_id_in_one_upsert_keeps_the_last(store: VectorStore, tenant: str) -> None:
    report = store.upsert(tenant, [obj("tool:a", category="first"), obj("tool:a", category="last")])

    assert report.written == ("tool:a",) and store.count(tenant) == 1
    assert ids(search(store, tenant, category="last")) == ["tool:a"]


def test_an_object_the_store_refuses_is_reported_and_the_rest_written(
    store: VectorStore, tenant: str
) -> None:
    store.upsert(tenant, [obj("tool:a")])

    report = store.upsert(tenant, [obj("tool:b"), StoredObject("tool:odd", [1.0, 2.0, 3.0])])

    assert report.written == ("tool:b",)
    assert [f.id for f in report.failed] == ["tool:odd"] and report.failed[0].reason
    assert not report.ok and store.count(tenant) == 2


def test_delete_removes_and_ignores_absent_ids(store: VectorStore, tenant: str) -> None:
    store.upsert(tenant, [obj("tool:a"), obj("tool:b"), obj("tool:c")])

    assert store.delete(tenant, ["tool:a", "tool:c", "tool:never"]) == 2
    assert store.count(tenant) == 1
    assert ids(search(store, tenant)) == ["tool:b"]
    assert store.delete(tenant, ["tool:a"]) == 0
    assert store.delete(tenant, []) == 0


# -- tenants ---------------------------------------------------------------------------------------


def test_tenants_are_isolated(store: VectorStore, tenant: str) -> None:
    other = new_tenant(store)
    store.upsert(tenant, [obj("tool:shared", category="mine"), obj("tool:only-mine")])
    store.upsert(other, [obj("tool:shared", category="theirs")])

    assert set(ids(search(store, tenant))) == {"tool:shared", "tool:only-mine"}
    assert ids(search(store, other)) == ["tool:shared"]
    assert ids(search(store, other, category="mine")) == []

    store.delete(other, ["tool:shared"])

    assert store.count(other) == 0 and store.count(tenant) == 2


def test_ensure_tenant_is_idempotent(store: VectorStore, tenant: str) -> None:
    store.upsert(tenant, [obj("tool:a")])

    store.ensure_tenant(tenant)

    assert store.count(tenant) == 1


@pytest.mark.parametrize("operation", ["upsert", "search", "count", "delete"])
def test_an_unknown_tenant_is_an_error_not_an_empty_answer(
    store: VectorStore, operation: str
) -> None:
    missing = f"never{uuid.uuid4().hex[:8]}"
    calls: dict[str, Callable[[], object]] = {
        "upsert": lambda: store.upsert(missing, [obj("tool:a")]),
        "search": lambda: search(store, missing),
        "count": lambda: store.count(missing),
        "delete": lambda: store.delete(missing, ["tool:a"]),
    }

    with pytest.raises(UnknownTenantError, match=missing):
        calls[operation]()


def test_an_invalid_tenant_name_is_refused(store: VectorStore) -> None:
    with pytest.raises(VectorStoreError, match="not a valid tenant name"):
        store.ensure_tenant("no spaces/or slashes")


# -- filters ---------------------------------------------------------------------------------------


@pytest.fixture
def catalog(store: VectorStore, tenant: str) -> str:
    store.upsert(
        tenant,
        [
            obj("tool:slack", kind="tool", category="chat", tags=("messaging", "slack")),
            obj("tool:email", kind="tool", category="mail", tags=("messaging",)),
            obj("skill:triage", kind="skill", category="chat", tags=("slack",)),
            obj("tool:fax", kind="tool", category="mail", available=False),
        ],
    )
    return tenant


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, {"tool:slack", "tool:email", "skill:triage", "tool:fax"}),
        ({"kind": "skill"}, {"skill:triage"}),
        ({"category": "mail"}, {"tool:email", "tool:fax"}),
        ({"kind": "tool", "category": "chat"}, {"tool:slack"}),
        ({"tags": ("messaging",)}, {"tool:slack", "tool:email"}),
        ({"tags": ("messaging", "slack")}, {"tool:slack"}),  # every tag is required
        ({"tags": ("slack", "nowhere")}, set()),
        ({"only_available": True}, {"tool:slack", "tool:email", "skill:triage"}),
        ({"only_installable": True}, {"tool:fax"}),
        (
            {"include_ids": frozenset({"tool:email", "tool:fax", "tool:unknown"})},
            {"tool:email", "tool:fax"},
        ),
        ({"include_ids": frozenset()}, set()),
        ({"exclude_ids": frozenset({"tool:slack", "skill:triage"})}, {"tool:email", "tool:fax"}),
        (
            {"include_ids": frozenset({"tool:email"}), "exclude_ids": frozenset({"tool:email"})},
            set(),
        ),
    ],
)
def test_every_filter(
    store: VectorStore, catalog: str, filters: dict[str, Any], expected: set[str]
) -> None:
    assert set(ids(search(store, catalog, **filters))) == expected


# -- visibility ------------------------------------------------------------------------------------


@pytest.fixture
def scoped(store: VectorStore, tenant: str) -> str:
    store.upsert(
        tenant,
        [
            obj("tool:open"),
            obj("tool:admins", vis_roles=("admin",)),
            obj("tool:ops-or-sre", vis_roles=("ops", "sre")),
            obj("tool:alice", vis_users=("alice",)),
            obj("tool:admins-and-bob", vis_roles=("admin",), vis_users=("bob",)),
        ],
    )
    return tenant


@pytest.mark.parametrize(
    ("roles", "user", "expected"),
    [
        ((), None, {"tool:open"}),
        (("admin",), None, {"tool:open", "tool:admins", "tool:admins-and-bob"}),
        (("sre",), None, {"tool:open", "tool:ops-or-sre"}),
        (
            ("admin", "ops"),
            None,
            {"tool:open", "tool:admins", "tool:ops-or-sre", "tool:admins-and-bob"},
        ),
        ((), "alice", {"tool:open", "tool:alice"}),
        ((), "bob", {"tool:open", "tool:admins-and-bob"}),
        (("sre",), "alice", {"tool:open", "tool:ops-or-sre", "tool:alice"}),
        (("guest",), "mallory", {"tool:open"}),
    ],
)
def test_visibility_open_role_user_and_none(
    store: VectorStore, scoped: str, roles: tuple[str, ...], user: str | None, expected: set[str]
) -> None:
    assert set(ids(search(store, scoped, roles=roles, user=user))) == expected


def test_visibility_applies_to_the_keyword_side_too(store: VectorStore, scoped: str) -> None:
    hits = search(store, scoped, query="capability tool admins", alpha=0.0)

    assert set(ids(hits)) == {"tool:open"}


def test_top_k_is_computed_over_visible_objects_only(store: VectorStore, tenant: str) -> None:
    store.upsert(
        tenant,
        [
            obj("tool:secret", vec(1, 0), vis_roles=("admin",)),
            obj("tool:close", vec(0.9, 0.3)),
            obj("tool:far", vec(0, 1)),
        ],
    )

    assert ids(search(store, tenant, 1, vector=vec(1, 0))) == ["tool:close"]
    assert ids(search(store, tenant, 1, vector=vec(1, 0), roles=("admin",))) == ["tool:secret"]
    assert ids(search(store, tenant, 2, vector=vec(1, 0))) == ["tool:close", "tool:far"]


def test_filters_and_visibility_combine(store: VectorStore, tenant: str) -> None:
    store.upsert(
        tenant,
        [
            obj("tool:a", category="chat", vis_roles=("ops",)),
            obj("tool:b", category="chat"),
            obj("tool:c", category="mail", vis_roles=("ops",)),
        ],
    )

    assert set(ids(search(store, tenant, category="chat", roles=("ops",)))) == {"tool:a", "tool:b"}
    assert set(ids(search(store, tenant, category="chat"))) == {"tool:b"}


def test_random_catalogs_never_leak(store: VectorStore, tenant: str) -> None:
    rng = np.random.default_rng(7)
    roles, users = ["a", "b", "c"], ["u1", "u2"]
    objects = []
    for i in range(24):
        objects.append(
            StoredObject(
                f"tool:{i}",
                rng.normal(size=DIM).astype(np.float32),
                text=f"word{i % 5} common",
                kind=str(rng.choice(["tool", "skill"])),
                category=str(rng.choice(["x", "y"])),
                available=bool(rng.random() < 0.7),
                vis_roles=tuple(r for r in roles if rng.random() < 0.3),
                vis_users=tuple(u for u in users if rng.random() < 0.2),
            )
        )
    store.upsert(tenant, objects)
    for trial in range(12):
        caller_roles = tuple(r for r in roles if rng.random() < 0.4)
        caller = str(rng.choice(users)) if rng.random() < 0.5 else None
        filters = SearchFilters(
            kind=str(rng.choice(["tool", "skill"])) if trial % 3 else None,
            only_available=bool(trial % 2),
            caller=Caller.of(caller_roles, caller),
        )
        admitted = {o.id for o in objects if filters.admits(o)}
        for alpha in (1.0, 0.5):
            hits = store.search(
                tenant, "word1 common", rng.normal(size=DIM), 50, alpha=alpha, filters=filters
            )
            assert set(ids(hits)) <= admitted
            if alpha == 1.0:  # the vector side ranks every admitted object
                assert set(ids(hits)) == admitted


# -- ranking ---------------------------------------------------------------------------------------


def test_alpha_one_ranks_by_vector(store: VectorStore, tenant: str) -> None:
    store.upsert(
        tenant,
        [obj("tool:x", vec(1, 0, 0)), obj("tool:y", vec(0.6, 0.8, 0)), obj("tool:z", vec(0, 0, 1))],
    )

    hits = search(store, tenant, vector=vec(1, 0.1, 0), query="tool z", alpha=1.0)

    assert ids(hits) == ["tool:x", "tool:y", "tool:z"]


def test_alpha_zero_ranks_by_keywords_and_drops_non_matches(
    store: VectorStore, tenant: str
) -> None:
    store.upsert(
        tenant,
        [
            obj("tool:x", vec(1, 0), text="invoice payment refund"),
            obj("tool:y", vec(0, 1), text="refund refund refund ledger"),
            obj("tool:z", vec(1, 0.1), text="weather forecast"),
        ],
    )

    hits = search(store, tenant, vector=vec(1, 0), query="refund", alpha=0.0)

    assert ids(hits) == ["tool:y", "tool:x"]


def test_scores_are_fused_between_zero_and_one_best_first(store: VectorStore, tenant: str) -> None:
    store.upsert(tenant, [obj(f"tool:{i}", vec(1, i / 4), text=f"alpha beta{i}") for i in range(6)])

    hits = search(store, tenant, vector=vec(1, 0), query="beta3", alpha=0.5)

    scores = [h.score for h in hits]
    assert len(hits) == 6 and scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 + 1e-6 for s in scores)
    assert ids(hits)[0] in {"tool:0", "tool:3"}


def test_k_limits_and_zero_returns_nothing(store: VectorStore, tenant: str) -> None:
    store.upsert(tenant, [obj(f"tool:{i}", vec(1, i)) for i in range(5)])

    assert len(search(store, tenant, 3)) == 3
    assert search(store, tenant, 0) == []


def test_alpha_outside_zero_to_one_is_refused(store: VectorStore, tenant: str) -> None:
    with pytest.raises(VectorStoreError, match="alpha"):
        search(store, tenant, alpha=1.5)


# -- stored objects and fusion ----------------------------------------------------------------


def test_stored_objects_refuse_unusable_vectors() -> None:
    for bad in ([], [0.0, 0.0], [1.0, float("nan")], [[1.0], [2.0]]):
        with pytest.raises(VectorStoreError, match="vector"):
            StoredObject("tool:a", bad)


def test_relative_score_fusion_is_weaviates_definition() -> None:
    # Weaviate's documented example: scores [1, 8, 6, 11] normalize to [0, 0.7, 0.5, 1].
    fused = relative_score_fusion([(1.0, {"a": 1, "b": 8, "c": 6, "d": 11})])
    assert fused == pytest.approx({"a": 0.0, "b": 0.7, "c": 0.5, "d": 1.0})
    # Equal scores on a side count as the side's whole weight; sides add up per id.
    fused = relative_score_fusion([(0.25, {"a": 3.0, "b": 3.0}), (0.75, {"b": 2.0, "c": 1.0})])
    assert fused == pytest.approx({"a": 0.25, "b": 1.0, "c": 0.0})


def test_objects_from_capabilities_carry_their_visibility() -> None:
    base = Capability(
        id="tool:x",
        kind="tool",
        name="x",
        description="Does x.",
        category="ops",
        tags=("t",),
        available=False,
    )
    restricted = base.with_changes(visibility=Visibility(("ops",), ("alice",)))

    stored = StoredObject.from_capability(base, [1.0, 0.0])
    assert stored.visibility == Visibility() and stored.visibility.open
    assert (stored.kind, stored.category, stored.tags, stored.available) == (
        "tool",
        "ops",
        ("t",),
        False,
    )
    assert "Does x." in stored.text
    stored = StoredObject.from_capability(restricted, [1.0, 0.0])
    assert (stored.vis_roles, stored.vis_users) == (("ops",), ("alice",))
    assert stored.visibility == restricted.visibility and not stored.visibility.open


# -- the one visibility rule and its renderings ----------------------------------------------------
#
# capdisc.access.visible is the rule and SearchFilters.admits applies it with the other filters;
# the retrieval index's row mask and the Weaviate query filter render the same thing for speed.
# These tests hold both renderings to the rule.

ROLE_SETS = [(), ("a",), ("b",), ("a", "b")]
USER_SETS = [(), ("u",), ("u", "v")]
CALLERS = [Caller.of(roles, user) for roles in ROLE_SETS for user in (None, "u", "w")]
#: One capability per visibility: open, per role set, per user set, and both.
GRID = [
    Capability(
        id=f"tool:v{i}",
        kind="tool",
        name=f"v{i}",
        description="d",
        visibility=Visibility(roles, users),
    )
    for i, (roles, users) in enumerate(itertools.product(ROLE_SETS, USER_SETS))
]


def index_mask(capabilities: list[Capability], filters: SearchFilters) -> list[bool]:
    """The rows the retrieval index lets ``filters`` rank, one flag per capability."""
    index = RetrievalIndex.build(capabilities, np.ones((len(capabilities), 4), dtype=np.float32))
    return [bool(flag) for flag in index._allowed(filters)]


def weaviate_matches(capabilities: list[Capability], filters: SearchFilters) -> list[bool]:
    """Whether the filter the Weaviate adapter sends for ``filters``, in its wire form, matches
    each capability's stored properties (evaluated as the fake Weaviate evaluates it)."""
    pytest.importorskip("weaviate", reason="needs weaviate-client: pip install 'capdisc[weaviate]'")
    import fake_weaviate
    from weaviate.collections.filters import _FilterToGRPC

    from capdisc.vectorstores.weaviate import object_properties, query_filter

    sent = _FilterToGRPC.convert(query_filter(filters))
    rows = [
        fake_weaviate.StoredRow(
            c.id, object_properties(StoredObject.from_capability(c, vec(1.0))), {}
        )
        for c in capabilities
    ]
    return [fake_weaviate.matches(sent, row) for row in rows]


@pytest.mark.parametrize("caller", CALLERS, ids=str)
def test_the_index_mask_is_the_access_rule(caller: Caller) -> None:
    expected = [visible(c.visibility, caller) for c in GRID]

    assert index_mask(GRID, SearchFilters(caller=caller)) == expected


@pytest.mark.parametrize("caller", CALLERS, ids=str)
def test_the_weaviate_filter_is_the_access_rule(caller: Caller) -> None:
    expected = [visible(c.visibility, caller) for c in GRID]

    assert weaviate_matches(GRID, SearchFilters(caller=caller)) == expected


def test_a_capability_and_its_stored_object_are_admitted_alike() -> None:
    for capability, caller in itertools.product(GRID, CALLERS):
        stored = StoredObject.from_capability(capability, vec(1.0))
        filters = SearchFilters(caller=caller)

        assert stored.visible_to(caller) is visible(capability.visibility, caller)
        assert filters.admits(stored) is filters.admits(capability)


KINDS: list[Kind] = ["tool", "skill"]
WORDS = ["a", "b", "c"]
IDS = [f"tool:c{i}" for i in range(8)]
catalogs = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.sampled_from(["x", "y"]),
        st.lists(st.sampled_from(WORDS), max_size=2, unique=True),
        st.booleans(),
        st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
        st.lists(st.sampled_from(["u", "v"]), max_size=1, unique=True),
    ),
    min_size=1,
    max_size=len(IDS),
)
search_filters = st.builds(
    SearchFilters,
    kind=st.one_of(st.none(), st.sampled_from(KINDS)),
    category=st.one_of(st.none(), st.sampled_from(["x", "y"])),
    tags=st.lists(st.sampled_from(WORDS), max_size=2, unique=True).map(tuple),
    only_available=st.booleans(),
    only_installable=st.booleans(),
    exclude_ids=st.frozensets(st.sampled_from([*IDS, "tool:gone"]), max_size=3),
    include_ids=st.one_of(
        st.none(), st.frozensets(st.sampled_from([*IDS, "tool:gone"]), max_size=4)
    ),
    caller=st.builds(
        Caller.of,
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
        st.one_of(st.none(), st.sampled_from(["u", "v", "w"])),
    ),
)


@settings(max_examples=300, deadline=None)
@given(catalogs, search_filters)
def test_both_renderings_admit_what_the_filters_admit(
    rows: list[tuple[Kind, str, list[str], bool, list[str], list[str]]], filters: SearchFilters
) -> None:
    capabilities = [
        Capability(
            id=IDS[i],
            kind=kind,
            name=f"c{i}",
            description="d",
            category=category,
            tags=tuple(tags),
            available=available,
            visibility=Visibility(tuple(roles), tuple(users)),
        )
        for i, (kind, category, tags, available, roles, users) in enumerate(rows)
    ]
    expected = [filters.admits(c) for c in capabilities]

    assert index_mask(capabilities, filters) == expected
    if filters.admits_nothing:  # the adapter answers without a query
        assert not any(expected)
    else:
        assert weaviate_matches(capabilities, filters) == expected
