"""The reconciler finds drift between the registry and the index and repairs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.redistext import as_str
from capdisc.registry.reindexstore import ReindexJob, begin_reindex

from .conftest import Stack, publish
from .test_cli import run_cli

SPACE = "hashing-384.fs1"


def test_reconcile_reindexes_a_lost_vector_and_drops_an_orphan(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)
    connection.hdel(keys.vectors(tenant, SPACE), "tool:slack-post-message")
    connection.hset(
        keys.vectors(tenant, SPACE), "tool:long-gone", np.ones(384, dtype=np.float32).tobytes()
    )

    result = run_cli("reconcile", "--json", env=stack.env)
    answer = Client(connection, tenant=tenant, timeout_s=20).discover(
        "post a message to slack", min_version=report.index_version + 1
    )

    assert result.returncode == 0, result.stderr
    repaired = json.loads(result.stdout)["repaired"][tenant]
    assert repaired == {
        "missing_vectors": ["tool:slack-post-message"],
        "orphan_vectors": ["tool:long-gone"],
    }
    assert connection.hexists(keys.vectors(tenant, SPACE), "tool:slack-post-message")
    assert not connection.hexists(keys.vectors(tenant, SPACE), "tool:long-gone")
    assert answer.capabilities[0]["id"] == "tool:slack-post-message"


def test_reconcile_of_a_clean_tenant_changes_nothing(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)

    result = run_cli("reconcile", "--json", env=stack.env)

    assert tenant not in json.loads(result.stdout)["repaired"]
    assert int(connection.get(keys.version(tenant)) or 0) == report.index_version


def test_status_shows_the_last_reconcile(stack: Stack) -> None:
    run_cli("reconcile", env=stack.env)

    status = json.loads(run_cli("status", "--json", env=stack.env).stdout)

    assert status["last_reconcile"]["at_ms"] > 0
    assert "drift_repaired" in status


def test_the_periodic_reconciler_repairs_drift_on_its_own(
    stack: Stack, registry: Path, tmp_path: Path
) -> None:
    from capdisc.localredis import start_redis

    from .conftest import DISCOVERY_ARGV, INDEXING_ARGV, worker_env

    server = start_redis(tmp_path / "redis", durable=False)
    (tmp_path / "logs").mkdir()
    private = Stack(server, worker_env(server.url), tmp_path / "logs", [])
    try:
        private.spawn(
            "indexing",
            [*INDEXING_ARGV, "-n", "indexing-periodic@%h"],
            CAPDISC_RECONCILE_INTERVAL_S="1",
        )
        private.spawn("discovery", DISCOVERY_ARGV)
        report = publish(server.url, registry, "periodic", wait_s=90)
        connection = private.connection()
        last = connection.xrevrange(keys.CHANGES, count=1)[0][0]
        connection.hdel(keys.vectors("periodic", SPACE), "tool:slack-post-message")

        repaired = _await_change(connection, last, "tool:slack-post-message", timeout_s=60)

        assert repaired and report.index_version > 0
        assert connection.hexists(keys.vectors("periodic", SPACE), "tool:slack-post-message")
    finally:
        private.close()


def _await_change(connection: redis.Redis, after: bytes, cap_id: str, timeout_s: float) -> bool:
    """Block until a change record for ``cap_id`` is appended after ``after``."""
    for _ in range(int(timeout_s)):
        for _stream, entries in connection.xread({keys.CHANGES: after}, block=1000) or []:
            for entry_id, fields in entries:
                after = entry_id
                if fields[b"id"].decode() == cap_id:
                    return True
    return False


def test_a_reindex_that_never_finishes_is_abandoned_and_the_live_index_kept(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    publish(stack.url, registry, tenant)
    begin_reindex(connection, tenant, "stuck", SPACE, 64, fresh=False)
    connection.hset(keys.reindex(tenant), "started_at_ms", 1)  # long ago
    live = connection.hlen(keys.vectors(tenant, SPACE))

    report = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)

    assert "stuck" in report["abandoned_reindexes"]
    assert ReindexJob.read(connection, tenant) is None
    assert connection.hlen(keys.vectors(tenant, SPACE)) == live


def test_reconcile_prunes_an_outgrown_embedding_cache_and_keeps_the_live_texts(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    from capdisc.registry.policy import stored_capability
    from capdisc.registry.store import tenants
    from capdisc.retrieval.text import embedding_texts, text_hash
    from capdisc_workers.embedding import CACHE_ENTRIES_PER_CAPABILITY, CACHE_FLOOR_ENTRIES

    publish(stack.url, registry, tenant)
    stored = sum(connection.hlen(keys.caps(t)) for t in tenants(connection))
    bound = max(CACHE_FLOOR_ENTRIES, CACHE_ENTRIES_PER_CAPABILITY * stored)
    cache = keys.embedding_cache("hashing-384")
    live = {
        text_hash(text)
        for value in connection.hvals(keys.caps(tenant))
        for text in embedding_texts(stored_capability(value))  # type: ignore[arg-type]
    }
    junk = {f"stale-{i}": b"\0" * 16 for i in range(bound + 1)}  # past the bound whatever is there
    connection.hset(cache, mapping=junk)  # type: ignore[arg-type]

    report = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)

    assert report["embedding_cache_pruned"] >= len(junk)
    assert not any(connection.hmget(cache, list(junk)))
    assert all(connection.hmget(cache, sorted(live)))


def test_the_sweep_forgets_a_worker_gone_for_an_hour_and_keeps_the_live_ones(
    stack: Stack, connection: redis.Redis
) -> None:
    from capdisc.status import live_workers

    killed = {"id": "indexing@replaced-host", "kind": "indexing", "last_seen_ms": 1, "tasks": []}
    connection.hset(keys.WORKERS, killed["id"], json.dumps(killed))  # killed long ago
    live = {worker["id"] for worker in live_workers(connection)}

    result = run_cli("reconcile", "--json", env=stack.env)

    assert result.returncode == 0, result.stderr
    assert not connection.hexists(keys.WORKERS, killed["id"])
    assert live <= {as_str(worker_id) for worker_id in connection.hkeys(keys.WORKERS)}


def test_a_damaged_heartbeat_is_forgotten_and_the_sweep_goes_on(
    stack: Stack, connection: redis.Redis
) -> None:
    damaged = {"written-by-hand": "not json", "a-number": "5", "too-deep": "[" * 5000}
    connection.hset(keys.WORKERS, mapping=damaged)

    result = run_cli("reconcile", "--json", "--timeout", "20", env=stack.env)

    assert result.returncode == 0, result.stderr
    assert connection.hmget(keys.WORKERS, list(damaged)) == [None, None, None]


def test_reconcile_drops_the_cache_of_a_model_nothing_uses_any_more(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    from capdisc.redisclock import redis_now_ms

    publish(stack.url, registry, tenant)
    retired, other = keys.embedding_cache("retired-model"), keys.embedding_cache("other-model")
    connection.hset(retired, mapping={f"text-{i}": b"\0" * 16 for i in range(100)})
    connection.hset(other, "text", b"\0" * 16)
    beat = {"id": "indexing@other", "kind": "indexing", "embedder": "other-model"}
    connection.hset(
        keys.WORKERS, beat["id"], json.dumps({**beat, "last_seen_ms": redis_now_ms(connection)})
    )

    try:
        report = json.loads(run_cli("reconcile", "--json", env=stack.env).stdout)
    finally:
        connection.hdel(keys.WORKERS, beat["id"])

    assert not connection.exists(retired)
    assert report["embedding_caches_dropped"] == [retired]
    assert connection.exists(other)  # a worker with that model may still run
    assert connection.hlen(keys.embedding_cache("hashing-384")) > 0
