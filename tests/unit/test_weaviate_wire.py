"""The Weaviate adapter on the wire, against a fake Weaviate on loopback.

The fake (``tests/fixtures/fake_weaviate.py``) serves the REST API and the gRPC
``weaviate.v1.Weaviate`` service the way the client's own mock tests do; the real
``weaviate-client`` talks to it. These tests assert what the adapter *sends* (the collection
definition, tenant creation, batch objects, hybrid queries, deletes) and how it reacts to partial
batch failures, timeouts and unreachable servers. Loopback only, no real Weaviate.
"""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from capdisc.access import Caller
from capdisc.errors import CapdiscError, UnknownTenantError, VectorStoreError
from capdisc.filters import NO_FILTERS, SearchFilters
from capdisc.resources import weaviate_settings
from capdisc.settings import Settings
from capdisc.vectorstores.port import StoredObject
from capdisc.vectorstores.weaviate import WeaviateStoreSettings, WeaviateVectorStore, object_uuid

pytest.importorskip(
    "weaviate",
    reason="the Weaviate adapter needs weaviate-client (pip install 'capdisc[weaviate]')",
)


import fake_weaviate
from weaviate.proto.v1 import base_pb2, base_search_pb2

Fake = Any  # fake_weaviate.FakeWeaviate


@pytest.fixture
def fake() -> Iterator[Fake]:
    yield from fake_weaviate.running()


def make_store(fake: Fake, **changes: Any) -> WeaviateVectorStore:
    values: dict[str, Any] = {
        "url": fake.url,
        "grpc_port": fake.grpc_port,
        "timeout_init_s": 2.0,
        "timeout_query_s": 2.0,
        "timeout_insert_s": 2.0,
        "retry_delay_s": 0.0,
    }
    values.update(changes)
    return WeaviateVectorStore(WeaviateStoreSettings(**values))


@pytest.fixture
def store(fake: Fake) -> Iterator[WeaviateVectorStore]:
    running = make_store(fake)
    yield running
    running.close()


def obj(key: str, *values: float, **fields: Any) -> StoredObject:
    return StoredObject(key, np.array(values or (1.0, 0.0, 0.0), dtype=np.float32), **fields)


def floats(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def readable(f: base_pb2.Filters) -> tuple[Any, ...]:
    """A filter tree as nested tuples: (operator, property, value) or (operator, [children])."""
    op = base_pb2.Filters.Operator.Name(f.operator).removeprefix("OPERATOR_")
    if f.filters:
        return (op, [readable(sub) for sub in f.filters])
    return (op, f.target.property, fake_weaviate._filter_values(f))


# -- the collection and tenants --------------------------------------------------------------------


def test_nothing_connects_until_first_use(fake: Fake) -> None:
    make_store(fake)

    assert fake.rest_calls == [] and fake.grpc_calls == []


def test_the_collection_is_multi_tenant_without_auto_creation_with_one_named_vector(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")

    [create] = fake.rest("POST", "/v1/schema")[:1]
    body = create.body
    assert body["class"] == "Capability"
    assert body["multiTenancyConfig"] == {
        "enabled": True,
        "autoTenantCreation": False,
        "autoTenantActivation": True,
    }
    assert body["vectorConfig"] == {
        "capability": {
            "vectorizer": {"none": {}},
            "vectorIndexType": "hnsw",
            "vectorIndexConfig": {"distance": "cosine"},
        }
    }
    assert "vectorizer" not in body and "vectorIndexConfig" not in body  # no unnamed vector
    props = {p["name"]: p for p in body["properties"]}
    assert {n: p["dataType"] for n, p in props.items()} == {
        "capability_id": ["text"],
        "kind": ["text"],
        "category": ["text"],
        "tags": ["text[]"],
        "vis_roles": ["text[]"],
        "vis_users": ["text[]"],
        "available": ["boolean"],
        "vis_open": ["boolean"],
        "text": ["text"],
    }
    for name in ("capability_id", "kind", "category", "tags", "vis_roles", "vis_users"):
        assert (
            props[name]["tokenization"],
            props[name]["indexFilterable"],
            props[name]["indexSearchable"],
        ) == ("field", True, False), name
    assert (props["text"]["tokenization"], props["text"]["indexSearchable"]) == ("word", True)


def test_tenants_are_created_explicitly_by_name_once(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    store.ensure_tenant("acme")
    store.ensure_tenant("globex")

    created = [c.body for c in fake.rest("POST", "/v1/schema/Capability/tenants")]
    assert created == [
        [{"name": "acme", "activityStatus": "HOT"}],
        [{"name": "globex", "activityStatus": "HOT"}],
    ]
    assert fake.state.tenants["Capability"] == {"acme", "globex"}


def test_another_process_reuses_the_collection_and_tenant(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    second = make_store(fake)

    second.ensure_tenant("acme")

    assert len(fake.rest("POST", "/v1/schema")) == 2  # the class once, the tenant once
    assert len(fake.rest("HEAD", "/v1/schema/Capability/tenants/acme")) == 2
    second.close()


@pytest.mark.parametrize(
    ("tenancy", "vector", "problem"),
    [
        ({"enabled": False}, "capability", "multi-tenancy is off"),
        (
            {"enabled": True, "autoTenantCreation": True},
            "capability",
            "automatic tenant creation is on",
        ),
        ({"enabled": True}, "other", "no named vector 'capability'"),
    ],
)
def test_an_existing_collection_that_does_not_fit_is_refused(
    fake: Fake, store: WeaviateVectorStore, tenancy: dict[str, bool], vector: str, problem: str
) -> None:
    fake.handle_rest(
        "POST",
        "/v1/schema",
        {
            "class": "Capability",
            "multiTenancyConfig": tenancy,
            "vectorConfig": {vector: {"vectorizer": {"none": {}}}},
            "properties": [{"name": "text", "dataType": ["text"]}],
        },
    )

    with pytest.raises(VectorStoreError) as info:
        store.ensure_tenant("acme")

    assert problem in str(info.value) and "CAPDISC_WEAVIATE_COLLECTION" in str(info.value)
    assert fake.rest("POST", "/v1/schema/Capability/tenants") == []


# -- writes ----------------------------------------------------------------------------------------


def test_batches_carry_vectors_uuid5_ids_tenant_and_properties(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    report = store.upsert(
        "acme",
        [
            obj(
                "tool:a",
                0.25,
                0.5,
                1.0,
                text="post to slack",
                kind="tool",
                category="chat",
                tags=("slack", "messaging"),
                available=False,
                vis_roles=("ops",),
                vis_users=("alice", "bob"),
            )
        ],
    )

    assert report.ok and report.written == ("tool:a",)
    [request] = fake.requests("BatchObjects")
    [sent] = request.objects
    assert sent.collection == "Capability" and sent.tenant == "acme"
    assert sent.uuid == str(uuid.uuid5(uuid.NAMESPACE_DNS, "acme/tool:a"))
    assert fake_weaviate.decode_vectors(sent) == {"capability": [0.25, 0.5, 1.0]}
    assert fake_weaviate.decode_properties(sent.properties) == {
        "capability_id": "tool:a",
        "text": "post to slack",
        "kind": "tool",
        "category": "chat",
        "tags": ["slack", "messaging"],
        "available": False,
        "vis_open": False,
        "vis_roles": ["ops"],
        "vis_users": ["alice", "bob"],
    }


def test_ids_are_deterministic_per_tenant_so_rewrites_replace(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    for tenant in ("acme", "globex"):
        store.ensure_tenant(tenant)
    store.upsert("acme", [obj("tool:a")])
    store.upsert("acme", [obj("tool:a", 0.0, 1.0, 0.0)])
    store.upsert("globex", [obj("tool:a")])

    uuids = [o.uuid for r in fake.requests("BatchObjects") for o in r.objects]
    assert uuids[0] == uuids[1] == object_uuid("acme", "tool:a")
    assert uuids[2] == object_uuid("globex", "tool:a") != uuids[0]
    assert store.count("acme") == 1


def test_writes_are_split_into_batches(fake: Fake) -> None:
    store = make_store(fake, batch_size=2)
    store.ensure_tenant("acme")

    report = store.upsert("acme", [obj(f"tool:{i}") for i in range(5)])

    assert [len(r.objects) for r in fake.requests("BatchObjects")] == [2, 2, 1]
    assert len(report.written) == 5
    store.close()


def test_a_refused_object_is_sent_once_more(fake: Fake, store: WeaviateVectorStore) -> None:
    store.ensure_tenant("acme")
    fake.reject(object_uuid("acme", "tool:b"), "shard is read-only", times=1)

    report = store.upsert("acme", [obj("tool:a"), obj("tool:b"), obj("tool:c")])

    assert report.ok and report.written == ("tool:a", "tool:b", "tool:c")
    assert report.retried == 1
    second = fake.requests("BatchObjects")[1]
    assert [o.uuid for o in second.objects] == [object_uuid("acme", "tool:b")]
    assert store.count("acme") == 3


def test_objects_refused_twice_are_reported_with_the_servers_reason(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    fake.reject(object_uuid("acme", "tool:c"), "vector lengths don't match", times=2)

    report = store.upsert("acme", [obj("tool:a"), obj("tool:c")])

    assert report.written == ("tool:a",) and report.retried == 1
    assert [(f.id, f.reason) for f in report.failed] == [("tool:c", "vector lengths don't match")]
    assert len(fake.requests("BatchObjects")) == 2  # one retry, not more


def test_a_batch_refused_entirely_is_reported_per_object(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    for key in ("tool:a", "tool:b"):
        fake.reject(object_uuid("acme", key), "disk full", times=2)

    report = store.upsert("acme", [obj("tool:a"), obj("tool:b")])

    assert report.written == () and report.retried == 2
    assert [(f.id, f.reason) for f in report.failed] == [
        ("tool:a", "disk full"),
        ("tool:b", "disk full"),
    ]


def test_deletes_name_the_uuid5_ids_in_the_tenant(fake: Fake, store: WeaviateVectorStore) -> None:
    store.ensure_tenant("acme")
    store.upsert("acme", [obj("tool:a"), obj("tool:b")])

    assert store.delete("acme", ["tool:a", "tool:x"]) == 1

    [request] = fake.requests("BatchDelete")
    assert (request.collection, request.tenant) == ("Capability", "acme")
    assert readable(request.filters) == (
        "CONTAINS_ANY",
        "_id",
        sorted([object_uuid("acme", "tool:a"), object_uuid("acme", "tool:x")]),
    )


def test_count_aggregates_over_the_tenant(fake: Fake, store: WeaviateVectorStore) -> None:
    store.ensure_tenant("acme")
    store.upsert("acme", [obj("tool:a"), obj("tool:b")])

    assert store.count("acme") == 2

    [request] = fake.requests("Aggregate")
    assert (request.collection, request.tenant, request.objects_count) == (
        "Capability",
        "acme",
        True,
    )


# -- queries ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["1.36.9", "1.30.0"])
def test_hybrid_queries_send_our_vector_alpha_fusion_target_and_filters(server: str) -> None:
    fake = fake_weaviate.FakeWeaviate(version=server).start()
    store = make_store(fake)
    try:
        store.ensure_tenant("acme")
        store.upsert("acme", [obj("tool:a", text="slack", category="chat", tags=("slack", "chat"))])
        filters = SearchFilters(
            kind="tool",
            category="chat",
            tags=("slack", "chat"),
            only_available=True,
            include_ids=frozenset({"tool:a", "tool:b"}),
            exclude_ids=frozenset({"tool:b", "tool:z"}),
            caller=Caller.of(["ops", "admin"], "alice"),
        )

        hits = store.search(
            "acme", "post to slack", np.array([0.5, 0.25, 1.0]), 7, alpha=0.3, filters=filters
        )

        [request] = fake.requests("Search")
    finally:
        store.close()
        fake.stop()
    assert [h.id for h in hits] == ["tool:a"] and 0 < hits[0].score <= 1
    assert (request.collection, request.tenant, request.limit) == ("Capability", "acme", 7)
    hybrid = request.hybrid_search
    alpha = hybrid.alpha_param if hybrid.use_alpha_param else hybrid.alpha
    assert alpha == pytest.approx(0.3)
    assert hybrid.use_alpha_param is (server >= "1.36.6")
    assert hybrid.query == "post to slack" and list(hybrid.properties) == ["text"]
    assert floats(hybrid.vector_bytes) == [0.5, 0.25, 1.0]
    assert list(hybrid.targets.target_vectors) == ["capability"]
    assert hybrid.fusion_type == base_search_pb2.Hybrid.FUSION_TYPE_RELATIVE_SCORE
    assert list(request.properties.non_ref_properties) == ["capability_id"]
    assert request.metadata.score
    assert readable(request.filters) == (
        "AND",
        [
            (
                "OR",
                [
                    ("EQUAL", "vis_open", [True]),
                    ("CONTAINS_ANY", "vis_roles", ["admin", "ops"]),
                    ("CONTAINS_ANY", "vis_users", ["alice"]),
                ],
            ),
            ("EQUAL", "kind", ["tool"]),
            ("EQUAL", "category", ["chat"]),
            ("CONTAINS_ALL", "tags", ["chat", "slack"]),
            ("EQUAL", "available", [True]),
            ("CONTAINS_ANY", "capability_id", ["tool:a"]),
            ("NOT_EQUAL", "capability_id", ["tool:b"]),
            ("NOT_EQUAL", "capability_id", ["tool:z"]),
        ],
    )


def test_a_caller_without_roles_or_user_sees_only_open_capabilities(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    store.upsert("acme", [obj("tool:open"), obj("tool:closed", vis_roles=("ops",))])

    hits = store.search("acme", "", [1.0, 0.0, 0.0], 5, alpha=1.0, filters=NO_FILTERS)

    [request] = fake.requests("Search")
    assert readable(request.filters) == ("EQUAL", "vis_open", [True])
    assert request.hybrid_search.query == ""  # no text: the client sends none
    assert [h.id for h in hits] == ["tool:open"]


def test_an_empty_allowlist_answers_without_a_query(fake: Fake, store: WeaviateVectorStore) -> None:
    store.ensure_tenant("acme")

    hits = store.search(
        "acme", "x", [1.0, 0.0, 0.0], 5, alpha=0.5, filters=SearchFilters(include_ids=frozenset())
    )

    assert hits == [] and fake.requests("Search") == []


def test_results_come_back_best_first_with_the_servers_scores(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    store.upsert(
        "acme", [obj("tool:x", 1, 0, 0), obj("tool:y", 0.6, 0.8, 0), obj("tool:z", 0, 0, 1)]
    )

    hits = store.search("acme", "", [1.0, 0.1, 0.0], 2, alpha=1.0, filters=NO_FILTERS)

    assert [h.id for h in hits] == ["tool:x", "tool:y"]
    assert hits[0].score == pytest.approx(1.0) and hits[0].score > hits[1].score


# -- failures --------------------------------------------------------------------------------------


def test_a_search_timeout_is_an_error_naming_the_query_timeout(fake: Fake) -> None:
    store = make_store(fake, timeout_query_s=0.3)
    store.ensure_tenant("acme")
    fake.delays["Search"] = 1.5

    started = time.monotonic()
    with pytest.raises(VectorStoreError) as info:
        store.search("acme", "x", [1.0, 0.0, 0.0], 3, alpha=0.5, filters=NO_FILTERS)

    message = str(info.value)
    assert "timed out" in message and "query timeout of 0.3 s" in message
    assert "CAPDISC_WEAVIATE_TIMEOUT_QUERY_S" in message and "tenant 'acme'" in message
    assert time.monotonic() - started < 1.4  # the deadline, not the server, ended the call
    store.close()


def test_a_batch_timeout_is_an_error_naming_the_insert_timeout(fake: Fake) -> None:
    store = make_store(fake, timeout_insert_s=0.3)
    store.ensure_tenant("acme")
    fake.delays["BatchObjects"] = 1.5

    with pytest.raises(VectorStoreError) as info:
        store.upsert("acme", [obj("tool:a")])

    assert "insert timeout of 0.3 s" in str(info.value)
    assert "CAPDISC_WEAVIATE_TIMEOUT_INSERT_S" in str(info.value)
    assert len(fake.requests("BatchObjects")) == 1  # a failed call is raised, not re-sent
    store.close()


def test_a_rest_timeout_is_an_error_naming_the_timeout(fake: Fake) -> None:
    store = make_store(fake, timeout_query_s=0.3)
    fake.delays["/v1/schema/Capability/tenants/"] = 1.5

    with pytest.raises(VectorStoreError, match=r"query timeout of 0\.3 s"):
        store.ensure_tenant("acme")
    store.close()


def test_an_unknown_tenant_is_an_unknown_tenant_error(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")

    with pytest.raises(UnknownTenantError, match="'globex'"):
        store.search("globex", "x", [1.0, 0.0, 0.0], 3, alpha=0.5, filters=NO_FILTERS)
    assert fake.requests("Search") == []


def test_a_tenant_removed_on_the_server_is_an_unknown_tenant_error(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    store.count("acme")
    fake.state.tenants["Capability"].discard("acme")

    with pytest.raises(UnknownTenantError, match="'acme'"):
        store.search("acme", "x", [1.0, 0.0, 0.0], 3, alpha=0.5, filters=NO_FILTERS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_an_unreachable_server_names_the_url_setting() -> None:
    store = WeaviateVectorStore(
        WeaviateStoreSettings(
            url=f"http://127.0.0.1:{free_port()}", grpc_port=free_port(), timeout_init_s=1
        )
    )

    with pytest.raises(VectorStoreError, match="CAPDISC_WEAVIATE_URL"):
        store.ensure_tenant("acme")


def test_a_closed_grpc_port_names_the_grpc_port_setting(fake: Fake) -> None:
    store = make_store(fake, grpc_port=free_port(), timeout_init_s=1)

    with pytest.raises(VectorStoreError, match="CAPDISC_WEAVIATE_GRPC_PORT"):
        store.ensure_tenant("acme")


def test_errors_are_capdisc_errors_caused_by_the_vendor_error(fake: Fake) -> None:
    store = make_store(fake, timeout_query_s=0.2)
    store.ensure_tenant("acme")
    fake.delays["Aggregate"] = 1.0

    with pytest.raises(CapdiscError) as info:
        store.count("acme")

    assert type(info.value.__cause__).__module__.startswith("weaviate")
    store.close()


# -- connection lifecycle --------------------------------------------------------------------------


def test_the_api_key_goes_with_rest_and_grpc_calls(fake: Fake) -> None:
    store = make_store(fake, api_key="s3cret")
    store.ensure_tenant("acme")
    store.count("acme")

    assert {c.headers.get("authorization") for c in fake.rest_calls} == {"Bearer s3cret"}
    assert fake.grpc_metadata[-1]["authorization"] == "Bearer s3cret"
    assert "s3cret" not in repr(store.settings)
    store.close()


def test_init_checks_stay_on_loopback(fake: Fake, store: WeaviateVectorStore) -> None:
    store.ensure_tenant("acme")

    paths = [c.path for c in fake.rest_calls]
    assert paths[:2] == ["/v1/meta", "/v1/.well-known/live"]  # no OIDC, no PyPI lookup


def test_a_forked_child_builds_its_own_client(
    fake: Fake, store: WeaviateVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.ensure_tenant("acme")
    parent = store._client
    meta_calls = len(fake.rest("GET", "/v1/meta"))

    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a child after fork
    store.count("acme")

    assert store._client is not parent and store._client is not None
    assert len(fake.rest("GET", "/v1/meta")) == meta_calls + 1
    assert parent is not None and parent.is_connected()  # the parent's client is left alone
    store.close()  # the child's own client
    parent.close()


def test_close_closes_and_the_store_reconnects_on_next_use(
    fake: Fake, store: WeaviateVectorStore
) -> None:
    store.ensure_tenant("acme")
    client = store._client

    store.close()

    assert client is not None and not client.is_connected() and store._client is None
    assert store.count("acme") == 0
    assert store._client is not None and store._client is not client


def test_settings_come_from_capdisc_environment_variables() -> None:
    settings = Settings.load(
        environ={
            "CAPDISC_WEAVIATE_URL": "https://weaviate.internal:8443",
            "CAPDISC_WEAVIATE_GRPC_PORT": "50052",
            "CAPDISC_WEAVIATE_API_KEY": "k",
            "CAPDISC_WEAVIATE_COLLECTION": "Capability2",
            "CAPDISC_WEAVIATE_TIMEOUT_QUERY_S": "3",
        }
    )

    store_settings = weaviate_settings(settings)

    assert (
        store_settings.url,
        store_settings.grpc_port,
        store_settings.api_key,
        store_settings.collection,
        store_settings.timeout_query_s,
    ) == ("https://weaviate.internal:8443", 50052, "k", "Capability2", 3.0)
    assert "CAPDISC_WEAVIATE_API_KEY" not in repr(settings) and "'k'" not in repr(settings)


def test_no_url_is_a_clear_error() -> None:
    with pytest.raises(VectorStoreError, match="CAPDISC_WEAVIATE_URL"):
        weaviate_settings(Settings.load(environ={}))
