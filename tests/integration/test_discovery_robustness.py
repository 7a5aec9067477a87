"""No request can end a discovery worker: against the suite's live worker, a broken session
import, bytes that are not UTF-8 on the request stream, text the CLI or the client cannot
encode, and an entry that crashed every worker that took it are each refused (an error reply
naming the field, or a dead letter) while the same worker process goes on answering."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc import keys
from capdisc.client import Client, wait_for_reply
from capdisc.errors import (
    BadRequestError,
    DiscoveryTimeout,
    RedisUnavailableError,
    RequestEncodeError,
    UnknownTenantError,
)
from capdisc.registry.deadletters import dead_letter, list_dead_letters

from .conftest import DISCOVERY_ARGV, Stack, publish
from .private import PrivateStack, dead_letters_by_entry, wait_for
from .test_cli import CLI, run_cli


def discovery_worker(stack: Stack) -> subprocess.Popen[bytes]:
    """The suite's discovery worker (the first one started)."""
    return next(p for p in stack.processes if p.args == DISCOVERY_ARGV)


def still_serving(stack: Stack, worker: subprocess.Popen[bytes]) -> None:
    """The same worker process is alive and answers."""
    assert worker.poll() is None, f"the discovery worker exited; see {stack.log_dir}"
    answer = Client(stack.connection(), tenant="warmup", timeout_s=20).discover("ping")
    assert answer.ids == ["tool:ping"]


def dead_letter_of(connection: redis.Redis, entry_id: str) -> dict[str, str]:
    return wait_for(
        lambda: dead_letters_by_entry(connection).get(entry_id),
        10,
        f"a dead letter for request entry {entry_id}",
    )


def gone_from_the_stream(connection: redis.Redis, entry_id: str) -> bool:
    return not connection.xrange(keys.DISCOVERY_REQUESTS, entry_id, entry_id)


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"bound": []}, "created_ms"),
        ({"created_ms": 1, "bound": []}, "bound"),
        ({"created_ms": "yesterday", "bound": {}}, "created_ms"),
        ({"created_ms": 1, "bound": {"tool:a": [1, 2]}}, "bound"),
    ],
)
def test_a_broken_session_import_is_refused_naming_the_field(
    stack: Stack, tmp_path: Path, document: dict[str, Any], field: str
) -> None:
    worker = discovery_worker(stack)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))

    result = run_cli("session", "import", f"s9-{uuid.uuid4().hex[:6]}", str(bad), env=stack.env)

    assert result.returncode == 2, result.stderr
    assert f"session import field '{field}'" in result.stderr
    assert "Traceback" not in result.stderr
    still_serving(stack, worker)


def test_bytes_that_are_not_utf8_on_the_request_stream_are_dead_lettered(
    stack: Stack, connection: redis.Redis
) -> None:
    worker = discovery_worker(stack)

    entry_id = connection.xadd(keys.DISCOVERY_REQUESTS, {"payload": b"\xff\xfe garbage"}).decode()

    letter = dead_letter_of(connection, entry_id)
    assert "field 'payload' is not UTF-8 text (byte 0xff at offset 0)" in letter["reason"]
    assert "request_id" not in letter
    assert gone_from_the_stream(connection, entry_id)
    still_serving(stack, worker)

    listed = run_cli("dlq", "list", "--json", "--limit", "100000", env=stack.env)
    mine = [
        d
        for d in json.loads(listed.stdout)["dead_letters"]
        if d["source"] == keys.DISCOVERY_REQUESTS and d["reason"] == letter["reason"]
    ]
    assert mine and mine[-1]["request_id"] is None and mine[-1]["capability_id"] is None
    human = run_cli("dlq", "list", "--limit", "100000", env=stack.env)
    assert "discovery request (no readable request id)" in human.stdout

    replay = run_cli("dlq", "replay", mine[-1]["id"], env=stack.env)
    assert replay.returncode == 1
    assert replay.stdout == f"{mine[-1]['id']}: refused: a discovery request\n"
    assert "is a discovery request" in replay.stderr and "cannot be replayed" in replay.stderr


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"payload": json.dumps({"query": 5})}, "discovery request field 'query' must be a string"),
        (
            {"op": "frobnicate", "payload": json.dumps({"query": "x"})},
            "request entry field 'op' must be one of discover, session, got 'frobnicate'",
        ),
        (
            {"op": "session", "payload": json.dumps({"op": "delete", "session": "s"})},
            "session request field 'op' must be one of call, show, export, import, watch",
        ),
        (
            {"payload": json.dumps({"query": "x", "limit": 10**30})},
            "field 'limit' must be from 1 to 10000",
        ),
        (
            {"payload": json.dumps({"query": "x"}), "deadline_ms": b"\xfe"},
            "request entry field 'deadline_ms' is not UTF-8 text",
        ),
    ],
)
def test_a_malformed_request_with_a_request_id_gets_an_error_reply_naming_the_field(
    stack: Stack, connection: redis.Redis, entry: dict[str, Any], problem: str
) -> None:
    worker = discovery_worker(stack)
    request_id = f"bad-{uuid.uuid4().hex}"
    payload = json.loads(entry["payload"])
    entry = {**entry, "payload": json.dumps({**payload, "request_id": request_id})}

    connection.xadd(keys.DISCOVERY_REQUESTS, entry)

    reply = wait_for_reply(connection, request_id, 10)
    assert reply is not None and reply["error"] == "bad_request"
    assert problem in reply["message"]
    still_serving(stack, worker)


def test_the_cli_refuses_arguments_that_are_not_utf8_without_a_traceback(stack: Stack) -> None:
    result = subprocess.run(
        [*CLI, "discover", b"\xff\xfe post to slack"],
        env=stack.env,
        capture_output=True,
        timeout=60,
    )

    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "Invalid value for 'QUERY': must be UTF-8 text; found byte 0xff" in stderr
    assert "Traceback" not in stderr


def test_the_cli_refuses_an_import_file_with_a_lone_surrogate_without_a_traceback(
    stack: Stack, tmp_path: Path
) -> None:
    exported = tmp_path / "s.json"
    exported.write_text('{"created_ms": 1, "bound": {"tool:\\udc80": [1, 1, 0]}}')

    result = run_cli("session", "import", "s-surrogate", str(exported), env=stack.env)

    assert result.returncode == 2
    assert "session request field 'data' carries text that is not valid Unicode" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_client_refuses_a_lone_surrogate_naming_the_argument(stack: Stack) -> None:
    client = Client(stack.connection(), tenant="warmup", timeout_s=5)

    with pytest.raises(
        RequestEncodeError,
        match=r"field 'query' carries text that is not "
        r"valid Unicode \(byte 0x80",
    ):
        client.discover("\udc80")
    with pytest.raises(RequestEncodeError, match="field 'session'"):
        client.working_set("s\ud800")


def test_names_given_as_one_string_instead_of_a_list_are_refused_naming_the_field(
    stack: Stack,
) -> None:
    client = Client(stack.connection(), tenant="warmup", timeout_s=20)
    as_roles = Client(stack.connection(), tenant="warmup", timeout_s=20, roles="ops")  # type: ignore[arg-type]

    with pytest.raises(BadRequestError, match="field 'tags' must be a list of strings, got a str"):
        client.discover("ping", tags="ping")  # type: ignore[arg-type]
    with pytest.raises(BadRequestError, match="field 'roles' must be a list of strings, got a s"):
        as_roles.discover("ping")


def test_the_client_refuses_a_query_too_large_to_send_before_sending_it(
    stack: Stack, connection: redis.Redis
) -> None:
    client = Client(stack.connection(), tenant="warmup", timeout_s=5)
    last_before = connection.xinfo_stream(keys.DISCOVERY_REQUESTS)["last-generated-id"]

    with pytest.raises(RequestEncodeError, match=r"its field 'query' takes \d+ of them"):
        client.discover("x" * 100_000)

    assert connection.xinfo_stream(keys.DISCOVERY_REQUESTS)["last-generated-id"] == last_before


def test_an_entry_delivered_three_times_unanswered_is_quarantined(
    stack: Stack, connection: redis.Redis, dead_consumer: str
) -> None:
    worker = discovery_worker(stack)
    request_id = f"poison-{uuid.uuid4().hex}"
    entry_id = _delivered_to_a_dead_consumer(connection, dead_consumer, request_id, times=3)

    reply = wait_for_reply(connection, request_id, 15)

    assert reply is not None and reply["error"] == "quarantined"
    assert "delivered 3 times and never answered" in reply["message"]
    letter = dead_letter_of(connection, entry_id)
    assert letter["request_id"] == request_id and letter["attempts"] == "3"
    assert "quarantined" in letter["reason"]
    assert gone_from_the_stream(connection, entry_id)
    still_serving(stack, worker)


def test_an_entry_a_dead_consumer_left_once_is_still_served(
    stack: Stack, connection: redis.Redis, dead_consumer: str
) -> None:
    request_id = f"orphan-{uuid.uuid4().hex}"
    entry_id = _delivered_to_a_dead_consumer(connection, dead_consumer, request_id, times=1)

    reply = wait_for_reply(connection, request_id, 15)

    assert reply is not None and "error" not in reply
    assert [c["id"] for c in reply["capabilities"]] == ["tool:ping"]
    assert gone_from_the_stream(connection, entry_id)


def _delivered_to_a_dead_consumer(
    connection: redis.Redis, consumer: str, request_id: str, times: int
) -> str:
    """Add a request and deliver it ``times`` to ``consumer``, which never answers (first in
    the transaction that adds it, so no live worker reads it before), then age it past
    ``claim_idle_ms``; its entry id."""
    payload = json.dumps({"query": "ping", "tenant": "warmup", "request_id": request_id})
    with connection.pipeline(transaction=True) as pipe:
        pipe.xadd(keys.DISCOVERY_REQUESTS, {"payload": payload})
        pipe.xreadgroup(keys.DISCOVERY_GROUP, consumer, {keys.DISCOVERY_REQUESTS: ">"}, count=1)
        added, read = pipe.execute()
    entry_id = added.decode()
    assert read[0][1][0][0].decode() == entry_id
    for _ in range(times - 1):  # reading its own pending entry again is another delivery
        connection.xreadgroup(
            keys.DISCOVERY_GROUP, consumer, {keys.DISCOVERY_REQUESTS: "0"}, count=1
        )
    pending = connection.xpending_range(
        keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP, "-", "+", 10, consumername=consumer
    )
    assert [(p["message_id"].decode(), p["times_delivered"]) for p in pending] == [
        (entry_id, times)
    ]
    connection.xclaim(
        keys.DISCOVERY_REQUESTS,
        keys.DISCOVERY_GROUP,
        consumer,
        0,
        [entry_id],
        idle=3_600_000,
        justid=True,
    )  # idle as if it hung for an hour
    return entry_id


@pytest.fixture
def dead_consumer(connection: redis.Redis) -> Iterator[str]:
    """A consumer name of the discovery group that never answers; removed afterwards."""
    name = f"crashed-{uuid.uuid4().hex[:8]}"
    yield name
    connection.xgroup_delconsumer(keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP, name)


def test_dlq_replay_all_replays_events_and_leaves_discovery_requests(tmp_path: Path) -> None:
    with PrivateStack(tmp_path, durable=False) as private:
        connection = private.connection()
        dead_letter(connection, '{"type": "upsert"}', "event field 'tenant' is missing")
        dead_letter(
            connection,
            '{"payload": "\\\\xff"}',
            "discovery request refused: ...",
            source=keys.DISCOVERY_REQUESTS,
            entry_id="1-0",
        )

        result = run_cli("dlq", "replay", "--all", "--redis-url", private.url, env=private.env)

        assert result.returncode == 0, result.stderr
        assert result.stdout.count(": replayed") == 1
        assert "left 1 discovery request(s): they cannot be replayed" in result.stdout
        assert [d.source for d in list_dead_letters(connection)] == [keys.DISCOVERY_REQUESTS]
        assert connection.llen(keys.INDEXING_QUEUE) == 1


def test_requests_nobody_answers_stay_near_the_cap_of_the_stream(tmp_path: Path) -> None:
    """With no discovery worker running, clients asking again and again trim the stream as they
    add to it, instead of filling Redis's memory."""
    private = PrivateStack(tmp_path, durable=False)
    try:
        private.connection().config_set("hz", 500)  # short BLPOP timeouts end on time
        client = Client(private.connection(), timeout_s=0.02, resend_after_s=0.005, backlog_max=10)
        for _ in range(150):
            with pytest.raises(DiscoveryTimeout):
                client.discover("anything")

        held = private.connection().xlen(keys.DISCOVERY_REQUESTS)
    finally:
        private.close()

    assert 10 <= held <= 110  # approximate trimming drops whole stream nodes of 100 entries


def test_a_full_redis_is_named_as_such_when_the_call_times_out(tmp_path: Path) -> None:
    private = PrivateStack(tmp_path, durable=False)
    try:
        private.connection().config_set("maxmemory", 1)  # every write refused (noeviction)
        with pytest.raises(RedisUnavailableError, match="Redis is full") as info:
            Client(private.connection(), timeout_s=0.5).discover("anything")
    finally:
        private.close()

    assert "maxmemory" in str(info.value)


def test_a_version_not_reached_in_time_is_answered_at_the_version_served_before_the_client_gives_up(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    version = publish(stack.url, registry, tenant).index_version
    client = Client(connection, tenant=tenant, timeout_s=2.0)  # shorter than discover_timeout_s

    answer = client.discover("post a message to slack", min_version=version + 1000)

    assert answer.index_version == version


@pytest.mark.parametrize("op", ["call", "show"])
def test_a_session_command_for_an_unknown_tenant_is_refused_naming_it(
    connection: redis.Redis, op: str
) -> None:
    tenant = f"nosuch{uuid.uuid4().hex[:8]}"
    client = Client(connection, tenant=tenant, timeout_s=10)
    commands = {
        "call": lambda: client.record_tool_call("s1", "tool:stripe-refund", {"amount": 1}),
        "show": lambda: client.working_set("s1"),
    }

    with pytest.raises(UnknownTenantError, match=tenant):
        commands[op]()
    assert not connection.exists(keys.session(tenant, "s1"))
