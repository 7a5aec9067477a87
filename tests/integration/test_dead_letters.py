"""Dead letters: listed with their reason, replayed by id, over a real Redis and worker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis

from capdisc import keys
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.registry.deadletters import (
    dead_letter,
    list_dead_letters,
    read_dead_letter,
    replay,
)
from capdisc.registry.events import RegistryEvent
from capdisc.settings import Settings
from capdisc_producers.publisher import Publisher

from .conftest import Stack
from .private import PrivateStack
from .test_cli import run_cli


def dead_letter_of(stack: Stack, connection: redis.Redis, payload: str) -> str:
    """Send ``payload`` to the indexing worker and wait for its dead letter; its entry id."""
    start = newest_dead_letter(connection)
    Publisher(stack.url).send_raw(payload)
    return str(await_dead_letter(connection, start, payload)[0])


def newest_dead_letter(connection: redis.Redis) -> Any:
    last = connection.xrevrange(keys.DEADLETTERS, count=1)
    return last[0][0] if last else "0-0"


def await_dead_letter(connection: redis.Redis, start: Any, payload: str) -> tuple[str, str]:
    """The entry id and reason of the dead letter of ``payload`` after ``start``, waited for."""
    for _ in range(20):
        entries = connection.xread({keys.DEADLETTERS: start}, block=500)
        for _stream, items in entries or []:
            for entry_id, fields in items:
                if fields[b"payload"].decode() == payload:
                    return entry_id.decode(), fields[b"reason"].decode()
                start = entry_id
    raise AssertionError(f"no dead letter for {payload}")


def undecodable(tenant: str) -> str:
    return json.dumps({"type": "upsert", "tenant": tenant})  # no capability_id, no seq


def test_dead_letters_list_with_reason_tenant_and_attempts(
    stack: Stack, connection: redis.Redis
) -> None:
    tenant = f"dlq-{uuid.uuid4().hex[:8]}"
    entry_id = dead_letter_of(stack, connection, undecodable(tenant))

    result = run_cli("dlq", "list", "--json", "--limit", "100000", env=stack.env)

    assert result.returncode == 0, result.stderr
    mine = [d for d in json.loads(result.stdout)["dead_letters"] if d["id"] == entry_id]
    assert mine and mine[0]["tenant"] == tenant and mine[0]["attempts"] == 1
    assert "missing" in mine[0]["reason"]


def test_an_event_nested_too_deeply_to_parse_is_dead_lettered_not_lost(
    stack: Stack, connection: redis.Redis
) -> None:
    deep = "[" * 5_000

    entry_id = dead_letter_of(stack, connection, deep)

    assert "nested too deeply" in str(read_dead_letter(connection, entry_id).reason)
    connection.xdel(keys.DEADLETTERS, entry_id)


def test_replay_sends_the_event_again_and_removes_the_entry(
    stack: Stack, connection: redis.Redis
) -> None:
    payload = undecodable(f"dlq-{uuid.uuid4().hex[:8]}")
    entry_id = dead_letter_of(stack, connection, payload)
    last = connection.xrevrange(keys.DEADLETTERS, count=1)[0][0]

    result = run_cli("dlq", "replay", entry_id, env=stack.env)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{entry_id}: replayed\n"
    assert entry_id not in {d.entry_id for d in list_dead_letters(connection, 100_000)}
    again = connection.xread({keys.DEADLETTERS: last}, block=10_000)  # still poison: back
    assert any(f[b"payload"].decode() == payload for _s, items in again for _i, f in items)


def test_replay_of_an_unknown_id_fails_naming_it(stack: Stack) -> None:
    result = run_cli("dlq", "replay", "1-999999", env=stack.env)

    assert result.returncode == 1  # it named something capdisc does not hold
    assert result.stdout == "1-999999: not found\n"
    assert "no dead letter with id 1-999999" in result.stderr


def test_replay_needs_ids_or_all(stack: Stack) -> None:
    result = run_cli("dlq", "replay", env=stack.env)

    assert result.returncode == 2
    assert "give the entry ids to replay, or --all" in result.stderr


def test_replay_removes_only_what_it_sent(connection: redis.Redis) -> None:
    first = connection.xadd(
        keys.DEADLETTERS, {"payload": "p1", "reason": "r", "attempts": 2, "at_ms": 1}
    ).decode()
    second = connection.xadd(
        keys.DEADLETTERS, {"payload": "p2", "reason": "r", "attempts": 1, "at_ms": 2}
    ).decode()
    sent: list[str] = []

    replayed = replay(connection, sent.append, [second])

    ids = {d.entry_id for d in list_dead_letters(connection, 100_000)}
    assert (replayed, sent) == ([second], ["p2"])
    assert first in ids and second not in ids
    connection.xdel(keys.DEADLETTERS, first)


def test_a_dead_letter_capdisc_did_not_write_is_listed_as_far_as_it_can_be_read(
    connection: redis.Redis,
) -> None:
    odd = {
        b"payload": b"\xff\xfe",
        b"reason": b"r\xe9",
        b"attempts": b"many",
        b"at_ms": b"9" * 5000,
    }
    entry_id = connection.xadd(keys.DEADLETTERS, odd).decode()  # another program's write
    try:
        listed = {d.entry_id: d for d in list_dead_letters(connection, 100_000)}
    finally:
        connection.xdel(keys.DEADLETTERS, entry_id)

    assert (listed[entry_id].payload, listed[entry_id].reason) == ("\ufffd\ufffd", "r\ufffd")
    assert (listed[entry_id].attempts, listed[entry_id].at_ms) == (1, 0)


def test_a_dead_letter_nested_too_deeply_to_parse_is_listed(connection: redis.Redis) -> None:
    deep = "[" * 100_000
    dead_letter(connection, deep, "event is nested too deeply to read")
    entry_id = newest_dead_letter(connection).decode()
    try:
        listed = {d["id"]: d for d in (d.to_dict() for d in list_dead_letters(connection, 100_000))}
    finally:
        connection.xdel(keys.DEADLETTERS, entry_id)

    assert listed[entry_id]["reason"] == "event is nested too deeply to read"
    assert listed[entry_id]["capability_id"] is None


@contextmanager
def failing_embedder(
    stack: Stack, name: str, tenant: str, db: int, answered: list[Any]
) -> Iterator[tuple[str, redis.Redis, Any]]:
    """An indexing worker on its own broker and registry (database ``db``) whose OpenAI
    embedder answers ``answered`` first, then HTTP 500 every time; with two deliveries a task.
    Yields the Redis URL, a connection to it and the scripted server; stops and empties all."""
    from .conftest import INDEXING_ARGV
    from .test_openai_embedder import ERROR, Server, indexing_env

    server = Server()
    server.script = [*answered, *[(500, ERROR, {})] * 50]
    private = stack.url.rsplit("/", 1)[0] + f"/{db}"
    worker = stack.spawn(
        f"indexing-{name}",
        [*INDEXING_ARGV, "-n", f"{name}-{tenant}@%h"],
        CAPDISC_REDIS_URL=private,
        **indexing_env(server, max_attempts=2, retry_base_s=0.1),
    )
    connection = redis.Redis.from_url(private)
    try:
        yield private, connection, server
    finally:
        worker.terminate()
        worker.wait(timeout=15)
        server.close()
        connection.flushdb()
        connection.close()


def clock_upsert(tenant: str, batch_id: str | None = None) -> RegistryEvent:
    """The first upsert of a small tool, ``tool:clock``."""
    return RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id="tool:clock",
        seq=1,
        capability={"kind": "tool", "name": "clock", "description": "Tells the time."},
        batch_id=batch_id,
    )


def test_an_embedding_that_keeps_failing_is_retried_then_dead_lettered(
    stack: Stack, tenant: str
) -> None:
    from capdisc_producers.publisher import wait_for_acks

    with failing_embedder(stack, "failing", tenant, 9, []) as (private, connection, server):
        event = clock_upsert(tenant, batch_id=f"{tenant}-fail")
        Publisher(private).send([event])

        outcomes = wait_for_acks(connection, f"{tenant}-fail", 1, 90)

        assert outcomes[0]["decision"] == "dead_lettered"
        assert "embedding failed after 2 attempts" in outcomes[0]["reason"]
        assert "answered HTTP 500" in outcomes[0]["reason"]
        letters = list_dead_letters(connection, 100)
        assert [(d.attempts, d.to_dict()["capability_id"]) for d in letters] == [(2, "tool:clock")]
        assert len(server.requests) == 2  # one call per delivery: retries do not multiply
        assert connection.hget(keys.caps(tenant), "tool:clock") is None


def test_an_embedding_failing_in_a_later_chunk_keeps_what_was_applied_before_it(
    stack: Stack, tenant: str
) -> None:
    """A task of more than ``APPLY_CHUNK`` events embeds its second chunk while it writes the
    first: when that embedding keeps failing, the first chunk's events stay applied and only
    the others are retried, then dead-lettered."""
    import math

    from capdisc.embedders.openai import OpenAIEmbedderSettings
    from capdisc.registry.normalize import capability_from_record
    from capdisc.retrieval.text import embedding_texts
    from capdisc_producers.publisher import wait_for_acks
    from capdisc_workers.embedding import APPLY_CHUNK, MODEL_CALL_TEXTS

    batch = f"{tenant}-late"
    events = [
        RegistryEvent(
            type="upsert",
            tenant=tenant,
            capability_id=f"tool:t{i:03d}",
            seq=1,
            capability={"kind": "tool", "name": f"t{i:03d}", "description": f"Tool {i}."},
            batch_id=batch,
        )
        for i in range(APPLY_CHUNK + 10)
    ]
    first_texts = {
        t
        for e in events[:APPLY_CHUNK]
        for t in embedding_texts(capability_from_record(e.capability or {}, "test"))
    }
    per_request = OpenAIEmbedderSettings(api_key="sk-test").batch_size
    model_calls = [
        min(MODEL_CALL_TEXTS, len(first_texts) - start)
        for start in range(0, len(first_texts), MODEL_CALL_TEXTS)
    ]  # each model call is cut into requests of the adapter's batch size
    first_calls = sum(math.ceil(size / per_request) for size in model_calls)
    answered = [(200, None, {})] * first_calls
    with failing_embedder(stack, "failing-late", tenant, 10, answered) as (
        private,
        connection,
        server,
    ):
        Publisher(private).send(events)

        outcomes = wait_for_acks(connection, batch, len(events), 90)

        decisions = {o["capability_id"]: o["decision"] for o in outcomes}
        assert len(outcomes) == len(events)
        assert {decisions[e.capability_id] for e in events[:APPLY_CHUNK]} == {"upsert"}
        assert {decisions[e.capability_id] for e in events[APPLY_CHUNK:]} == {"dead_lettered"}
        letters = list_dead_letters(connection, 100)
        assert sorted(d.to_dict()["capability_id"] for d in letters) == sorted(
            e.capability_id for e in events[APPLY_CHUNK:]
        )
        assert {d.attempts for d in letters} == {2}
        assert connection.hlen(keys.caps(tenant)) == APPLY_CHUNK
        assert len(server.requests) == first_calls + 2  # one failing call per delivery


def test_a_queue_entry_that_is_no_message_is_kept_and_the_worker_reads_on(
    stack: Stack, connection: redis.Redis
) -> None:
    garbage = f"not a message {uuid.uuid4().hex}"
    start = newest_dead_letter(connection)

    connection.lpush(keys.INDEXING_QUEUE, garbage)

    _entry_id, reason = await_dead_letter(connection, start, garbage)
    assert "not JSON" in reason
    tenant = f"dlq-{uuid.uuid4().hex[:8]}"  # the worker still applies (here: refuses) events
    assert dead_letter_of(stack, connection, undecodable(tenant))


class BrokenEmbedder(HashingEmbedder):
    """An embedder with a fault no adapter translated: it raises what is no EmbeddingError."""

    def embed(self, texts: Sequence[str]) -> Any:
        raise ZeroDivisionError("a bug in the embedder")


def test_an_unexpected_error_dead_letters_the_events_instead_of_losing_them(
    stack: Stack, tenant: str
) -> None:
    from capdisc_workers.indexing import apply_payloads
    from capdisc_workers.resources import Resources

    private = stack.url.rsplit("/", 1)[0] + "/12"
    res = Resources.from_settings(Settings.load(environ={"CAPDISC_REDIS_URL": private}))
    res.__dict__["embedder"] = BrokenEmbedder()
    last_delivery = SimpleNamespace(
        name=keys.TASK_APPLY_EVENTS,
        request=SimpleNamespace(id="t1", retries=res.settings.indexing_max_attempts - 1),
    )
    payload = clock_upsert(tenant).encode()
    try:
        outcomes = apply_payloads(res, last_delivery, [payload])

        letters = list_dead_letters(res.redis, 100)
    finally:
        res.redis.flushdb()

    assert outcomes[0]["decision"] == "dead_lettered"
    assert "ZeroDivisionError: a bug in the embedder" in outcomes[0]["reason"]
    assert [d.payload for d in letters] == [payload]


def test_a_huge_dead_letter_keeps_only_its_start_marked_and_is_not_replayed(
    stack: Stack, connection: redis.Redis
) -> None:
    """A few huge events must not hold Redis's memory: the worker keeps at most
    deadletter_payload_max_bytes of each, marked with its whole size, and a replay of such a
    letter is refused (its start alone is another event)."""
    tenant = f"dlq-{uuid.uuid4().hex[:8]}"
    payload = json.dumps(
        {"type": "upsert", "tenant": tenant, "pad": "é" * 600_000}, ensure_ascii=False
    )
    start = newest_dead_letter(connection)
    Publisher(stack.url).send_raw(payload)
    entry_id, stored = "", b""
    for _ in range(20):
        for _stream, items in connection.xread({keys.DEADLETTERS: start}, block=500) or []:
            for found, fields in items:
                start = found
                if tenant.encode() in fields[b"payload"]:
                    entry_id, stored = found.decode(), fields[b"payload"]
        if entry_id:
            break

    assert entry_id, "no dead letter for the huge event"
    assert len(stored) < len(payload.encode())  # not kept whole
    assert len(stored) <= Settings().deadletter_payload_max_bytes
    assert payload.encode().startswith(stored)
    (letter,) = [d for d in list_dead_letters(connection, 100_000) if d.entry_id == entry_id]
    assert letter.truncated_from_bytes == len(payload.encode())

    listed = run_cli("dlq", "list", "--limit", "100000", env=stack.env)
    replayed = run_cli("dlq", "replay", entry_id, env=stack.env)

    assert f"cut short: {len(payload.encode())} bytes" in listed.stdout
    assert replayed.returncode == 1
    assert replayed.stdout == f"{entry_id}: refused: payload cut short\n"
    assert "deadletter_payload_max_bytes" in replayed.stderr
    assert "publish its source again" in replayed.stderr
    assert letter in list_dead_letters(connection, 100_000)


def test_a_payload_within_the_bound_is_kept_whole_and_unmarked(tmp_path: Path) -> None:
    private = PrivateStack(tmp_path, durable=False)
    try:
        connection = private.connection()
        dead_letter(connection, "é" * 600, "refused", max_bytes=1200)
        dead_letter(connection, "é" * 601, "refused", max_bytes=1200)
        whole, cut = list_dead_letters(connection)
    finally:
        private.close()

    assert (whole.payload, cut.payload) == ("é" * 600, "é" * 600)  # 2 bytes each
    assert (whole.truncated_from_bytes, cut.truncated_from_bytes) == (None, 1202)
