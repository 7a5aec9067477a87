"""The walking skeleton end to end: manifests -> Celery indexing -> discovery worker -> client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import yaml

from capdisc import keys
from capdisc.client import Client
from capdisc.errors import DiscoveryTimeout, UnknownTenantError
from capdisc.registry.manifest import load_manifest
from capdisc.status import collect_status
from capdisc_producers.publisher import Publisher

from .conftest import Stack, publish

SLACK = "slack/slack-post-message"


def _manifest(registry: Path, relative: str) -> Path:
    matches = sorted(registry.glob(f"*/{relative.split('/')[-1]}/CAPABILITY.yaml"))
    assert matches, f"example registry has no {relative}"
    return matches[0]


def _edit(path: Path, **changes: object) -> None:
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_published_registry_answers_a_query_with_the_expected_capability(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover(
        "post a message to the team's slack channel", min_version=report.index_version
    )

    assert report.complete and report.plan.errors == {}
    assert "tool:slack-post-message" in answer.ids[:3]
    assert answer.index_version == report.index_version


def test_edited_manifest_is_served_by_the_running_worker(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    first = publish(stack.url, registry, tenant)
    before = client.discover("anything at all", min_version=first.index_version)
    _edit(
        _manifest(registry, SLACK),
        display_name="Zanzibar Quokka Relay",
        description="Zanzibar quokka relay.",
    )

    second = publish(stack.url, registry, tenant)
    answer = client.discover(
        "zanzibar quokka relay",
        min_version=second.index_version,
        options={"tier1_min_relevance": 0.0, "use_graph_reranking": False},
    )

    assert [c.id for c in second.plan.upserts] == ["tool:slack-post-message"]
    assert answer.ids[0] == "tool:slack-post-message"
    assert answer.worker == before.worker
    assert answer.index_version == first.index_version + 1


def test_deleted_manifest_is_gone_from_answers_and_counts(
    stack: Stack, client: Client, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    first = publish(stack.url, registry, tenant)
    _manifest(registry, SLACK).unlink()

    second = publish(stack.url, registry, tenant)
    answer = client.discover(
        "post a message to the team's slack channel", min_version=second.index_version, limit=20
    )

    assert second.plan.deletes == ["tool:slack-post-message"]
    assert "tool:slack-post-message" not in answer.ids
    counts = collect_status(connection)["tenants"][tenant]
    assert counts["capabilities"] == len(first.plan.upserts) - 1


def test_broken_manifest_keeps_the_stored_capability_and_is_reported(
    stack: Stack, client: Client, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    first = publish(stack.url, registry, tenant)
    path = _manifest(registry, SLACK)
    stored_before = connection.hget(keys.caps(tenant), "tool:slack-post-message")
    path.write_text(path.read_text() + "kind: tool\n")

    second = publish(stack.url, registry, tenant)
    answer = client.discover(
        "post a message to the team's slack channel", min_version=first.index_version
    )

    assert second.sent == 0
    assert str(second.plan.errors[path]).startswith(f"{path}: field 'kind': ")
    assert "duplicate key" in str(second.plan.errors[path])
    assert connection.hget(keys.caps(tenant), "tool:slack-post-message") == stored_before
    assert "tool:slack-post-message" in answer.ids
    errors = collect_status(connection)["tenants"][tenant]["manifest_errors"]
    assert list(errors) == [str(path)]


def test_fixed_manifest_clears_its_reported_error(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    path = _manifest(registry, SLACK)
    good = path.read_text()
    path.write_text(good + "kind: tool\n")
    publish(stack.url, registry, tenant)
    path.write_text(good)

    publish(stack.url, registry, tenant)

    assert collect_status(connection)["tenants"][tenant]["manifest_errors"] == {}


def test_republishing_an_unchanged_registry_sends_nothing_and_embeds_nothing(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    publish(stack.url, registry, tenant)
    calls_before = collect_status(connection)["embedding_calls"]

    again = publish(stack.url, registry, tenant)

    assert again.sent == 0
    assert len(again.plan.unchanged) == len(list(registry.rglob("CAPABILITY.yaml")))
    assert collect_status(connection)["embedding_calls"] == calls_before


def test_same_content_in_another_tenant_reuses_the_shared_embedding_cache(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    publish(stack.url, registry, tenant)
    calls_before = collect_status(connection)["embedding_calls"]

    other = publish(stack.url, registry, f"{tenant}-copy")

    assert other.sent > 0
    assert collect_status(connection)["embedding_calls"] == calls_before


def test_unknown_tenant_gets_a_clear_error(client: Client) -> None:
    with pytest.raises(UnknownTenantError, match="no registry"):
        client.discover("anything", tenant="never-published")


def test_no_discovery_worker_raises_a_timeout_naming_the_workers(stack: Stack) -> None:
    lonely = Client.from_url(stack.url.rsplit("/", 1)[0] + "/5", timeout_s=0.3)

    with pytest.raises(DiscoveryTimeout, match="0 discovery worker"):
        lonely.discover("anything")


def test_malformed_event_is_dead_lettered_with_its_reason(
    stack: Stack, connection: redis.Redis
) -> None:
    last = connection.xrevrange(keys.DEADLETTERS, count=1)
    start = last[0][0] if last else "0-0"
    publisher = Publisher(stack.url)

    publisher.send_raw('{"type": "upsert", "tenant": "x"}')
    entries = connection.xread({keys.DEADLETTERS: start}, count=1, block=4000)

    reason = entries[0][1][0][1][b"reason"].decode()
    assert "missing" in reason


def test_invalid_capability_in_an_event_is_dead_lettered_and_acked(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    from capdisc.registry.events import RegistryEvent
    from capdisc_producers.publisher import wait_for_acks

    event = RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id="tool:bad",
        seq=1,
        capability={"kind": "tool", "name": "bad", "description": 42},
        batch_id=f"{tenant}-batch",
    )
    Publisher(stack.url).send([event])

    outcomes = wait_for_acks(connection, f"{tenant}-batch", 1, 20)

    assert outcomes[0]["decision"] == "rejected"
    assert "field 'description': must be a string" in outcomes[0]["reason"]
    assert connection.hget(keys.caps(tenant), "tool:bad") is None


def test_status_reports_versions_counts_workers_and_queues(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)
    Client(connection, tenant=tenant).discover("x", min_version=report.index_version)

    status = collect_status(connection)

    mine = status["tenants"][tenant]
    assert mine["index_version"] == report.index_version
    assert sum(mine["by_kind"].values()) == mine["capabilities"] == len(report.plan.upserts)
    assert {w["kind"] for w in status["workers"]} == {"indexing", "discovery"}
    assert set(status["queues"]) == {"indexing", "discovery_requests"}
    assert {"embedding_calls", "dead_letters", "pending_events"} <= set(status)
    json.dumps(status)


def test_pending_events_count_queued_and_unacknowledged_ones(connection: redis.Redis) -> None:
    before = collect_status(connection)["pending_events"]
    connection.hset(keys.KOMBU_UNACKED, "test-delivery-tag", "{}")
    try:
        assert collect_status(connection)["pending_events"] == before + 1
    finally:
        connection.hdel(keys.KOMBU_UNACKED, "test-delivery-tag")


def test_manifest_parsed_by_the_producer_is_what_the_worker_serves(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)
    path = _manifest(registry, SLACK)
    expected = load_manifest(path, registry_root=registry.resolve())

    answer = client.discover(expected.description, min_version=report.index_version)

    top = answer.capabilities[0]
    assert (top["id"], top["name"], top["kind"]) == (expected.id, expected.name, expected.kind)


def test_answer_carries_tool_definitions_in_the_requested_format(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover(
        "open a pull request", min_version=report.index_version, tool_format="openai-chat"
    )

    names = [tool["function"]["name"] for tool in answer.tools]
    assert "discover_capabilities" in names
    assert answer.tool_names["github-create-pull-request"] == "tool:github-create-pull-request"


def test_metatool_call_runs_the_same_pipeline_and_returns_a_model_result(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    payload, answer = client.handle_metatool_call(
        '{"query": "open a pull request", "kind": "tool", "limit": 3}',
        min_version=report.index_version,
    )

    assert [c["id"] for c in payload["capabilities"]] == answer.ids
    assert len(answer.ids) <= 3 and all(c["kind"] == "tool" for c in answer.capabilities)
    assert "github-create-pull-request" in payload["details"]
