"""Who may learn a session's event stream, asked of a discovery worker in this process over a
Redis of the test's own (the worker's loops are not started: its snapshots are what the test
gives it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.discovery.protocol import SessionRequest
from capdisc.errors import ForbiddenError
from capdisc.localredis import start_redis
from capdisc.sessions import store
from capdisc.settings import Settings
from capdisc_workers.discovery import DiscoveryWorker


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[DiscoveryWorker]:
    server = start_redis(tmp_path / "redis", durable=False)
    connection = redis.Redis.from_url(server.url)
    try:
        yield DiscoveryWorker(Settings(redis_url=server.url, embedder="hashing"), connection)
    finally:
        connection.close()
        server.stop()


def watch(worker: DiscoveryWorker, tenant: str) -> str:
    reply = worker.session_op(SessionRequest(op="watch", session="s1", tenant=tenant))
    return str(reply.body["stream"])


def test_a_tenant_without_capabilities_can_be_watched_before_it_is_loaded(
    worker: DiscoveryWorker,
) -> None:
    worker.redis.sadd(keys.TENANTS, "empty")

    assert watch(worker, "empty") == store.stream_key(worker.redis, "empty", "s1")


def test_a_tenant_the_worker_has_not_loaded_is_not_watched_on_a_guess(
    worker: DiscoveryWorker,
) -> None:
    worker.redis.sadd(keys.TENANTS, "acme")
    worker.redis.hset(keys.caps("acme"), "tool:x", "{}")

    with pytest.raises(ForbiddenError, match="has not loaded tenant 'acme' yet"):
        watch(worker, "acme")
