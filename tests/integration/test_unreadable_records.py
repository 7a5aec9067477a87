"""A stored value that is no capability record (written into Redis by hand, or damaged) is
left out of what a discovery worker serves, listed by `capdisc status`, and removed by
`capdisc delete`; every other capability of its tenant is served as before."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_event

from .conftest import Stack, publish
from .test_cli import run_cli


def test_a_value_that_is_no_record_is_skipped_listed_and_deleted(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> None:
    connection.hset(keys.caps(tenant), "tool:broken", "not a record")  # before its first load
    report = publish(stack.url, registry, tenant)

    answer = Client(connection, tenant=tenant, timeout_s=20).discover(
        "refund a payment", min_version=report.index_version
    )
    status = json.loads(run_cli("status", "--json", env=stack.env).stdout)
    deleted = run_cli("delete", "tool:broken", "--tenant", tenant, env=stack.env)

    assert "tool:stripe-refund" in answer.ids
    assert status["tenants"][tenant]["unreadable_records"] == ["tool:broken"]
    assert status["tenants"][tenant]["capabilities"] == len(report.plan.upserts)
    assert deleted.returncode == 0, deleted.stderr
    assert not connection.hexists(keys.caps(tenant), "tool:broken")


def test_status_skips_heartbeats_and_reports_that_are_no_json(
    stack: Stack, connection: redis.Redis
) -> None:
    bogus = {"bogus": "not json", "old": '{"id": "old"}', "too-deep": "[" * 5000}
    connection.hset(keys.WORKERS, mapping=bogus)
    connection.hset(keys.SUPERVISED, mapping={"bogus": "not json", "too-deep": "[" * 5000})
    try:
        result = run_cli("status", "--json", env=stack.env)
        check = run_cli("status", "--check", env=stack.env)
    finally:
        connection.hdel(keys.WORKERS, *bogus)
        connection.hdel(keys.SUPERVISED, "bogus", "too-deep")

    assert result.returncode == 0, result.stderr
    workers = json.loads(result.stdout)["workers"]
    assert {w["kind"] for w in workers} == {"discovery", "indexing"}
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_reindex_of_a_value_that_is_no_record_finds_nothing_to_embed(
    connection: redis.Redis, tenant: str
) -> None:
    """The reconciler sends one for every record without a vector, so for this value at every
    run: it failed five times with a TypeError and was dead-lettered, every run, for ever."""
    connection.hset(keys.caps(tenant), "tool:broken", "not a record")
    event = RegistryEvent(type="reindex", tenant=tenant, capability_id="tool:broken", seq=1)

    outcome = apply_event(connection, event, None, lambda _c: b"", "space", acknowledge=False)

    assert outcome.decision == "not_found"
    assert connection.hget(keys.caps(tenant), "tool:broken") == b"not a record"
