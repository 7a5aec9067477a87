"""One tenant-name rule at every entry, against the live stack: a bad name gets a clear error at
once from the CLI (exit 2), the Client, the producers, a raw request entry and a raw registry
event, and no key containing it is ever written."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.client import Client, wait_for_reply
from capdisc.errors import TenantNameError
from capdisc.registry.events import RegistryEvent
from capdisc.tenants import TENANT_RULE
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import sync_directory

from .conftest import MAX_BYTES, Stack
from .test_cli import run_cli

BAD = [
    pytest.param("../x", id="path-traversal"),
    pytest.param("*", id="glob"),
    pytest.param("a:b", id="key-separator"),
    pytest.param("b" * 10_240, id="10kb"),
]


def keys_naming(connection: redis.Redis, name: str) -> list[bytes]:
    """Every key of the tenant ``name`` (``capdisc:t:{name}:...``), and the tenant set's entry."""
    prefix = f"{keys.PREFIX}:t:{name}:".encode()
    found = [k for k in connection.scan_iter(count=1000) if k.startswith(prefix)]
    if connection.sismember(keys.TENANTS, name):
        found.append(keys.TENANTS.encode())
    return found


def registry(tmp_path: Path) -> Path:
    (tmp_path / "reg" / "ping").mkdir(parents=True)
    (tmp_path / "reg" / "ping" / "CAPABILITY.yaml").write_text(
        "name: ping\nkind: tool\ndescription: Answers ping with pong.\n"
    )
    return tmp_path / "reg"


@pytest.mark.parametrize("name", BAD)
def test_every_command_refuses_a_bad_tenant_at_once_and_writes_nothing(
    stack: Stack, tmp_path: Path, connection: redis.Redis, name: str
) -> None:
    catalog = tmp_path / "tools.jsonl"
    catalog.write_text(json.dumps({"id": "x", "name": "x", "description": "X."}) + "\n")
    commands = [
        ["publish", str(registry(tmp_path)), "--timeout", "5"],
        ["discover", "post a message", "--session", "s1"],
        ["session", "show", "s1"],
        ["delete", "tool:ping"],
        ["import", "jsonl", str(catalog)],
    ]

    for command in commands:
        started = time.monotonic()
        result = run_cli(*command, "--tenant", name, env=stack.env)

        assert result.returncode == 2, (command, result.stderr)
        assert "Invalid value for '--tenant'" in result.stderr and TENANT_RULE in result.stderr
        assert "indexing worker running" not in result.stderr
        assert len(result.stderr) < 1000  # the name is quoted shortened
        assert time.monotonic() - started < 15  # refused before any wait
    assert keys_naming(connection, name) == []


@pytest.mark.parametrize("name", BAD)
def test_the_client_and_the_producers_refuse_a_bad_tenant_before_sending(
    stack: Stack, tmp_path: Path, connection: redis.Redis, name: str
) -> None:
    with pytest.raises(TenantNameError, match=r"^Client tenant .* is not a valid tenant name"):
        Client(connection, tenant=name)
    client = Client(connection, tenant="warmup", timeout_s=20)
    with pytest.raises(TenantNameError):
        client.discover("ping", tenant=name, session="s1")
    with pytest.raises(TenantNameError):
        client.record_tool_call("s1", "tool:ping", tenant=name)
    publisher = Publisher(stack.url)
    try:
        with pytest.raises(TenantNameError):
            sync_directory(
                connection,
                publisher,
                registry(tmp_path),
                tenant=name,
                max_bytes=MAX_BYTES,
                wait_s=5,
            )
        with pytest.raises(TenantNameError):
            publisher.send(
                [RegistryEvent(type="delete", tenant=name, capability_id="tool:ping", seq=1)]
            )
    finally:
        publisher.close()
    assert keys_naming(connection, name) == []
    assert client.discover("ping").ids == ["tool:ping"]  # the client still works


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("op", ["discover", "session"])
def test_a_raw_request_entry_with_a_bad_tenant_gets_a_bad_request_naming_the_field(
    stack: Stack, connection: redis.Redis, name: str, op: str
) -> None:
    request_id = f"r-{uuid.uuid4().hex}"
    payload = (
        {"query": "ping", "tenant": name, "request_id": request_id, "session": "s1"}
        if op == "discover"
        else {
            "op": "call",
            "session": "s1",
            "tenant": name,
            "tool_id": "tool:ping",
            "request_id": request_id,
        }
    )
    connection.xadd(keys.DISCOVERY_REQUESTS, {"op": op, "payload": json.dumps(payload)})

    reply = wait_for_reply(connection, request_id, 20)

    assert reply is not None and reply["error"] == "bad_request"
    assert "field 'tenant' must be a tenant name" in reply["message"]
    assert TENANT_RULE in reply["message"] and len(reply["message"]) < 400
    assert keys_naming(connection, name) == []


@pytest.mark.parametrize("name", BAD)
def test_a_raw_registry_event_with_a_bad_tenant_is_dead_lettered_naming_the_field(
    stack: Stack, connection: redis.Redis, name: str
) -> None:
    cap_id = f"tool:bad-tenant-{uuid.uuid4().hex[:8]}"
    event = json.dumps(
        {
            "type": "upsert",
            "tenant": name,
            "capability_id": cap_id,
            "seq": 1,
            "capability": {"kind": "tool", "name": cap_id[5:], "description": "Never stored."},
            "event_id": uuid.uuid4().hex,
            "occurred_at_ms": 1,
            "schema_version": 1,
        }
    )
    last = connection.xrevrange(keys.DEADLETTERS, count=1)
    after = last[0][0] if last else b"0-0"
    publisher = Publisher(stack.url)
    try:
        publisher.send_raw(event)  # as a producer that skipped the check would
    finally:
        publisher.close()

    reason = _dead_letter_reason(connection, after, cap_id)

    assert reason.startswith("event field 'tenant' ") and TENANT_RULE in reason
    assert keys_naming(connection, name) == []


def _dead_letter_reason(connection: redis.Redis, after: bytes, cap_id: str) -> str:
    """The reason of the dead letter of ``cap_id``'s event, read as it arrives."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = connection.xread({keys.DEADLETTERS: after}, block=1000)
        for _stream, entries in batch or []:
            for entry_id, fields in entries:
                after = entry_id
                if cap_id.encode() in fields[b"payload"]:
                    return str(fields[b"reason"].decode())
    raise AssertionError(f"no dead letter for {cap_id} within 30 s")
