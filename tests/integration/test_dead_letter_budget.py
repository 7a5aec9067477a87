"""The dead letters' byte budget, on a Redis of each test's own: the oldest letters go while all
of them hold more than the budget, counted, and the count stays the stream's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.localredis import LocalRedis, start_redis
from capdisc.registry.deadletters import budget, dead_letter, drop, drop_all, replay
from capdisc.status import collect_status

from .conftest import worker_env
from .test_cli import run_cli

KIB = 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalRedis]:
    running = start_redis(tmp_path / "redis", durable=False)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def connection(server: LocalRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


def stored_bytes(connection: redis.Redis) -> int:
    """The bytes of the stream's fields, counted here from what Redis holds."""
    return sum(
        len(name) + len(value)
        for _id, fields in connection.xrange(keys.DEADLETTERS)
        for name, value in fields.items()
    )


def payloads(connection: redis.Redis) -> list[str]:
    return [fields[b"payload"].decode() for _id, fields in connection.xrange(keys.DEADLETTERS)]


def test_the_oldest_letters_go_once_the_letters_hold_more_than_the_budget(
    connection: redis.Redis,
) -> None:
    for i in range(40):
        dead_letter(connection, f"{i:02d}" + "x" * 10 * KIB, "refused", budget_bytes=100 * KIB)

    kept = payloads(connection)
    assert stored_bytes(connection) <= 100 * KIB
    assert len(kept) == 9  # ten would be over 100 KiB with their other fields
    assert [p[:2] for p in kept] == [f"{i:02d}" for i in range(31, 40)]


def test_the_letters_dropped_for_the_budget_are_counted(connection: redis.Redis) -> None:
    for i in range(40):
        dead_letter(connection, f"{i:02d}" + "x" * 10 * KIB, "refused", budget_bytes=100 * KIB)

    assert budget(connection).dropped == 31
    status = collect_status(connection)
    assert status["dead_letters_dropped"] == 31
    assert status["dead_letter_bytes"] == stored_bytes(connection)


def test_a_letter_larger_than_the_budget_is_kept_alone(connection: redis.Redis) -> None:
    dead_letter(connection, "small", "refused", budget_bytes=4 * KIB)
    dead_letter(connection, "big" + "x" * 8 * KIB, "refused", budget_bytes=4 * KIB)

    assert [p[:3] for p in payloads(connection)] == ["big"]
    assert budget(connection).held_bytes == stored_bytes(connection)


def test_small_letters_are_not_dropped_under_the_budget(connection: redis.Redis) -> None:
    for i in range(200):
        dead_letter(connection, f"poison {i}", "refused")

    assert len(payloads(connection)) == 200
    assert budget(connection).dropped == 0


def test_the_count_is_the_streams_own_after_adds_replays_and_drops(
    connection: redis.Redis,
) -> None:
    for i in range(6):
        dead_letter(connection, f'{{"n": {i}}}' + " " * i * 100, f"reason {i}", attempts=i + 1)
    ids = [i.decode() for i, _f in connection.xrange(keys.DEADLETTERS)]

    replay(connection, lambda _payload: None, ids[:2])
    drop(connection, [ids[2], "1-0"])

    assert budget(connection).held_bytes == stored_bytes(connection) > 0


def test_dropping_every_letter_leaves_nothing_counted(connection: redis.Redis) -> None:
    for i in range(5):
        dead_letter(connection, f"poison {i}", "refused")

    drop_all(connection)

    assert budget(connection).held_bytes == 0


def test_a_letter_added_in_a_pipeline_is_counted(connection: redis.Redis) -> None:
    with connection.pipeline(transaction=False) as pipe:
        dead_letter(pipe, "poison in a pipeline", "refused")
        dead_letter(pipe, "another", "refused")
        pipe.execute()

    assert payloads(connection) == ["poison in a pipeline", "another"]
    assert budget(connection).held_bytes == stored_bytes(connection)


def test_letters_stored_before_the_budget_existed_are_counted_at_the_next(
    connection: redis.Redis,
) -> None:
    for i in range(250):  # more than one page of the script's count
        connection.xadd(keys.DEADLETTERS, {"payload": f"old {i}", "reason": "r"})

    dead_letter(connection, "new", "refused")

    assert budget(connection).held_bytes == stored_bytes(connection)


def test_a_stream_emptied_by_other_means_is_counted_afresh(connection: redis.Redis) -> None:
    for i in range(5):
        dead_letter(connection, f"poison {i}", "refused")
    connection.delete(keys.DEADLETTERS)

    dead_letter(connection, "after", "refused")
    dead_letter(connection, "and another", "refused")

    assert payloads(connection) == ["after", "and another"]
    assert budget(connection).held_bytes == stored_bytes(connection)


def test_the_entry_cap_is_kept_exactly_and_counted(
    connection: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys, "DEADLETTERS_MAXLEN", 10)
    for i in range(25):
        dead_letter(connection, f"poison {i}", "refused")

    assert payloads(connection) == [f"poison {i}" for i in range(15, 25)]
    assert budget(connection).dropped == 15
    assert budget(connection).held_bytes == stored_bytes(connection)


def test_the_metrics_show_the_bytes_held_and_the_letters_dropped(connection: redis.Redis) -> None:
    from capdisc_workers.metrics import RegistryGauges

    for i in range(12):
        dead_letter(connection, f"{i:02d}" + "x" * 10 * KIB, "refused", budget_bytes=100 * KIB)

    samples = {
        sample.name: sample.value
        for family in RegistryGauges(lambda: connection).collect()
        for sample in family.samples
    }

    assert samples["capdisc_dead_letter_bytes"] == stored_bytes(connection)
    assert samples["capdisc_dead_letters_dropped_total"] == 3
    assert samples["capdisc_dead_letters"] == 9


def test_dlq_list_says_how_many_older_letters_were_dropped(
    server: LocalRedis, connection: redis.Redis
) -> None:
    for i in range(12):
        dead_letter(connection, f"{i:02d}" + "x" * 10 * KIB, "refused", budget_bytes=100 * KIB)

    shown = run_cli("dlq", "list", "--limit", "1", env=worker_env(server.url))
    listed = run_cli("dlq", "list", "--json", env=worker_env(server.url))

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("3 older dead letters were dropped to keep the stream within")
    assert json.loads(listed.stdout)["dropped"] == 3
    assert json.loads(listed.stdout)["bytes"] == stored_bytes(connection)
