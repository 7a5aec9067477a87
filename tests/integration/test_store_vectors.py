"""The store keeps vectors per vector space: a capability stored before a space existed is
embedded for it when its next event arrives, even with unchanged content."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from capdisc import keys
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_event
from capdisc_workers.follower import RedisQueryVectors

from .conftest import Stack

CAP = Capability(id="tool:clock", kind="tool", name="clock", description="Tells the time.")


def upsert(tenant: str, seq: int) -> RegistryEvent:
    return RegistryEvent(
        type="upsert", tenant=tenant, capability_id=CAP.id, seq=seq, capability=CAP.to_dict()
    )


def vector_of(value: float) -> bytes:
    return np.full(4, value, dtype=np.float32).tobytes()


def test_an_unchanged_capability_is_embedded_for_a_new_vector_space(
    connection: redis.Redis, tenant: str
) -> None:
    apply_event(connection, upsert(tenant, 1), CAP, lambda _c: vector_of(1.0), "old-space")

    outcome = apply_event(
        connection, upsert(tenant, 2), CAP, lambda _c: vector_of(2.0), "new-space"
    )

    assert outcome.decision == "upsert"
    assert connection.hget(keys.vectors(tenant, "new-space"), CAP.id) == vector_of(2.0)
    assert connection.hget(keys.vectors(tenant, "old-space"), CAP.id) == vector_of(1.0)


def test_an_unchanged_capability_with_its_vector_costs_no_embedding(
    connection: redis.Redis, tenant: str
) -> None:
    calls: list[str] = []

    def embed(capability: Capability) -> bytes:
        calls.append(capability.id)
        return vector_of(1.0)

    apply_event(connection, upsert(tenant, 1), CAP, embed, "space")
    outcome = apply_event(connection, upsert(tenant, 2), CAP, embed, "space")

    assert outcome.decision == "unchanged"
    assert calls == [CAP.id]


def test_query_vectors_shared_by_workers_live_in_redis_and_expire(connection: redis.Redis) -> None:
    shared = RedisQueryVectors(connection, ttl_s=30, max_entries=100)

    shared.put("abc", vector_of(3.0))

    assert shared.flush(timeout_s=5)
    assert shared.get("abc") == vector_of(3.0)
    assert 0 < connection.ttl(keys.query_vectors("abc")) <= 30
    assert shared.get("missing") is None


def test_a_query_vector_write_redis_refuses_is_logged_not_raised() -> None:
    unreachable = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    shared = RedisQueryVectors(unreachable, ttl_s=30, max_entries=100)

    shared.put("abc", vector_of(3.0))  # handed to the writer thread: the turn goes on

    assert shared.flush(timeout_s=10)  # the writer tried, failed and went on
    assert shared.get("abc") is None


@pytest.fixture
def own_database(stack: Stack) -> Iterator[redis.Redis]:
    """A database of the suite's Redis that no worker writes to."""
    client = redis.Redis.from_url(stack.url.rsplit("/", 1)[0] + "/10")
    client.flushdb()
    yield client
    client.flushdb()


def test_the_shared_query_cache_drops_its_oldest_entries_past_its_cap(
    own_database: redis.Redis,
) -> None:
    shared = RedisQueryVectors(own_database, ttl_s=30, max_entries=3)

    for n in range(5):
        shared.put(f"q{n}", vector_of(float(n)))
        assert shared.flush(timeout_s=5)

    assert [shared.get(f"q{n}") for n in range(5)] == [None, None] + [
        vector_of(float(n)) for n in (2, 3, 4)
    ]
    assert own_database.zcard(keys.QUERY_VECTORS_INDEX) == 3


def test_entries_expired_from_the_shared_query_cache_leave_its_index(
    own_database: redis.Redis,
) -> None:
    shared = RedisQueryVectors(own_database, ttl_s=30, max_entries=100)
    own_database.zadd(keys.QUERY_VECTORS_INDEX, {"long-gone": 1.0})

    shared.put("fresh", vector_of(1.0))
    assert shared.flush(timeout_s=5)

    assert own_database.zrange(keys.QUERY_VECTORS_INDEX, 0, -1) == [b"fresh"]
    assert 0 < own_database.ttl(keys.QUERY_VECTORS_INDEX) <= 30
