"""Discovery on Weaviate, end to end on the wire: real indexing and discovery
workers with ``vector_store: weaviate`` against a fake Weaviate (REST and gRPC) this test runs on
loopback. Indexing writes every change there; discovery searches it per turn; answers keep their
shape. (The fake's scores follow capdisc's reference store, not Weaviate's arithmetic.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from capdisc.client import Client
from capdisc.localredis import start_redis
from capdisc.registry.policy import SyncPlan
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import publish_plan

from .conftest import DISCOVERY_ARGV, INDEXING_ARGV, Stack, publish, worker_env

fake_weaviate = pytest.importorskip("fake_weaviate")
TENANT = "wv"
SLACK = "tool:slack-post-message"


@pytest.fixture
def weaviate_stack(tmp_path: Path) -> Iterator[tuple[Stack, object]]:
    fake = fake_weaviate.FakeWeaviate().start()
    server = start_redis(tmp_path / "redis", durable=False)
    (tmp_path / "logs").mkdir()
    env = {
        **worker_env(server.url),
        "CAPDISC_VECTOR_STORE": "weaviate",
        "CAPDISC_WEAVIATE_URL": fake.url,
        "CAPDISC_WEAVIATE_GRPC_PORT": str(fake.grpc_port),
    }
    stack = Stack(server, env, tmp_path / "logs", [])
    try:
        stack.spawn("indexing", [*INDEXING_ARGV, "-n", "indexing-wv@%h"])
        stack.spawn("discovery", DISCOVERY_ARGV)
        yield stack, fake
    finally:
        stack.close()
        fake.stop()


def _drained(stack: Stack) -> None:
    """Return once the indexing worker finished every task sent so far: a task writes the store
    after its events are acknowledged, and the one solo worker runs tasks in order, so the
    acknowledgement of a task sent now comes after them."""
    import uuid

    from capdisc.registry.events import RegistryEvent
    from capdisc_producers.publisher import wait_for_acks

    batch = uuid.uuid4().hex
    publisher = Publisher(stack.url)
    publisher.send(
        [
            RegistryEvent(
                type="delete", tenant=TENANT, capability_id="tool:none", seq=1, batch_id=batch
            )
        ]
    )
    publisher.close()
    assert wait_for_acks(stack.connection(), batch, 1, 60)


def _objects(fake: object) -> int:
    state = fake.state  # type: ignore[attr-defined]
    return sum(len(rows) for (_c, tenant), rows in state.objects.items() if tenant == TENANT)


def test_discovery_searches_weaviate_and_indexing_writes_every_change(
    weaviate_stack: tuple[Stack, object], registry: Path
) -> None:
    stack, fake = weaviate_stack
    report = publish(stack.url, registry, TENANT, wait_s=90)
    client = Client(stack.connection(), tenant=TENANT, timeout_s=30)
    searches = len(fake.requests("Search"))  # type: ignore[attr-defined]

    answer = client.discover("post a message to slack", min_version=report.index_version)

    assert answer.ids[0] == SLACK
    assert {"tiers", "capabilities", "index_version"} <= set(answer.raw)
    assert len(fake.requests("Search")) > searches  # type: ignore[attr-defined]
    _drained(stack)
    assert _objects(fake) == len(report.plan.upserts)

    publisher = Publisher(stack.url)
    deleted = publish_plan(
        stack.connection(),
        publisher,  # as `capdisc delete ID` sends it
        SyncPlan(deletes=[SLACK], taken_over=[SLACK]),
        root=Path("cli"),
        tenant=TENANT,
        source="cli",
        wait_s=30,
    )
    publisher.close()
    after = client.discover("post a message to slack", min_version=deleted.index_version)
    _drained(stack)

    assert _objects(fake) == len(report.plan.upserts) - 1
    assert SLACK not in after.ids


def test_visibility_is_applied_inside_the_weaviate_query(
    weaviate_stack: tuple[Stack, object], registry: Path
) -> None:
    stack, _fake = weaviate_stack
    path = next(registry.glob("*/stripe-refund/CAPABILITY.yaml"))
    path.write_text(path.read_text() + "visibility:\n  roles: [finance]\n")
    report = publish(stack.url, registry, TENANT, wait_s=90)

    anonymous = Client(stack.connection(), tenant=TENANT, timeout_s=30).discover(
        "refund a stripe payment", min_version=report.index_version
    )
    finance = Client(stack.connection(), tenant=TENANT, timeout_s=30, roles=["finance"]).discover(
        "refund a stripe payment", min_version=report.index_version
    )

    assert "tool:stripe-refund" not in anonymous.ids
    assert finance.ids[0] == "tool:stripe-refund"


def test_the_reconciler_writes_back_what_the_store_lost(
    weaviate_stack: tuple[Stack, object], registry: Path
) -> None:
    import json

    from .test_cli import run_cli

    stack, fake = weaviate_stack
    report = publish(stack.url, registry, TENANT, wait_s=90)
    state = fake.state  # type: ignore[attr-defined]
    rows = next(r for (_c, tenant), r in state.objects.items() if tenant == TENANT)
    rows.pop(next(iter(rows)))  # the store lost one object

    result = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)

    assert TENANT in result["store_resynced"]
    assert _objects(fake) == len(report.plan.upserts)


def test_a_value_that_is_no_record_does_not_make_every_reconcile_rewrite_the_store(
    weaviate_stack: tuple[Stack, object], registry: Path
) -> None:
    import json

    from capdisc import keys

    from .test_cli import run_cli

    stack, fake = weaviate_stack
    report = publish(stack.url, registry, TENANT, wait_s=90)
    _drained(stack)
    stack.connection().hset(keys.caps(TENANT), "tool:damaged", "not a record")  # by hand
    writes = len(fake.requests("BatchObjects"))  # type: ignore[attr-defined]

    first = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)
    second = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)

    assert TENANT not in first.get("store_resynced", [])
    assert TENANT not in second.get("store_resynced", [])
    assert len(fake.requests("BatchObjects")) == writes  # type: ignore[attr-defined]
    assert _objects(fake) == len(report.plan.upserts)


def test_a_refused_event_in_a_batch_does_not_shift_what_reaches_the_store(
    weaviate_stack: tuple[Stack, object],
) -> None:
    from capdisc import keys
    from capdisc.registry.events import RegistryEvent
    from capdisc_producers.publisher import wait_for_acks

    stack, fake = weaviate_stack
    events = [
        RegistryEvent(
            type="upsert",
            tenant=TENANT,
            capability_id=f"tool:{name}",
            seq=1,
            capability={"kind": "tool", "name": name, "description": f"The {name} tool."},
            batch_id="b1",
        )
        for name in ("alpha", "beta")
    ]
    publisher = Publisher(stack.url)
    publisher.app.send_task(
        keys.TASK_APPLY_EVENTS,
        queue=keys.INDEXING_QUEUE,
        args=[['{"not": "an event"}', *(e.encode() for e in events)]],
    )
    outcomes = wait_for_acks(stack.connection(), "b1", 2, 60)
    publisher.close()
    _drained(stack)

    assert sorted(o["decision"] for o in outcomes) == ["upsert", "upsert"]
    assert _objects(fake) == 2


def test_a_change_the_store_refused_is_shown_and_written_again_by_the_reconciler(
    weaviate_stack: tuple[Stack, object], registry: Path
) -> None:
    import json

    from capdisc.vectorstores.weaviate import SEARCH_TEXT, object_uuid

    from .test_cli import run_cli

    stack, fake = weaviate_stack
    publish(stack.url, registry, TENANT, wait_s=90)
    slack = object_uuid(TENANT, SLACK)
    fake.reject(slack, "disk quota exceeded", times=2)  # type: ignore[attr-defined]
    path = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    path.write_text(
        path.read_text().replace("description: >-\n", "description: >-\n  Zanzibar.\n", 1)
    )
    publish(stack.url, registry, TENANT, wait_s=90)

    def stored_text() -> str:
        rows = fake.state.objects[("Capability", TENANT)]  # type: ignore[attr-defined]
        return str(rows[slack].properties[SEARCH_TEXT])

    status = json.loads(run_cli("status", "--json", env=stack.env).stdout)
    assert "Zanzibar" not in stored_text()
    assert "disk quota exceeded" in status["tenants"][TENANT]["store_unwritten"][SLACK]

    run_cli("reconcile", "--json", env=stack.env)
    status = json.loads(run_cli("status", "--json", env=stack.env).stdout)

    assert "Zanzibar" in stored_text()
    assert status["tenants"][TENANT]["store_unwritten"] == {}
