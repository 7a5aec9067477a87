"""``capdisc import jsonl``: a bulk catalog as one source, through the real workers."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.status import collect_status

from .conftest import Stack
from .test_cli import run_cli

TOOLS = [
    {
        "id": "getWeather",
        "name": "getWeather",
        "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "category": "Weather",
    },
    {
        "id": "sendEmail",
        "name": "sendEmail",
        "description": "Send an email message.",
        "parameters": None,
        "category": "Mail",
    },
    {
        "id": "PDF&URLTool",
        "name": "PDF&URLTool",
        "description": "Read PDFs and web pages.",
        "parameters": None,
        "category": "merged_tool",
    },
]


def write(path: Path, rows: list[object], extra: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    return path


def run_import(stack: Stack, path: Path, tenant: str) -> tuple[int, str, str]:
    result = run_cli("import", "jsonl", str(path), "--tenant", tenant, env=stack.env)
    return result.returncode, result.stdout, result.stderr


def test_a_catalog_is_imported_and_discoverable(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    code, out, err = run_import(stack, write(tmp_path / "tools.jsonl", TOOLS), tenant)

    assert code == 0, err
    assert "3 upserted, 0 deleted, 0 unchanged, 0 rejected" in out
    version = int(out.rsplit("index version ", 1)[1])
    answer = Client(connection, tenant=tenant, timeout_s=20).discover(
        "what is the weather forecast in Oslo", min_version=version
    )
    assert answer.ids[0] == "tool:getWeather"
    assert connection.hexists(keys.caps(tenant), "tool:PDF_URLTool")


def test_an_unchanged_reimport_sends_and_embeds_nothing(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    path = write(tmp_path / "tools.jsonl", TOOLS)
    run_import(stack, path, tenant)
    calls = collect_status(connection)["embedding_calls"]

    code, out, _err = run_import(stack, path, tenant)

    assert code == 0 and "0 upserted, 0 deleted, 3 unchanged" in out
    assert collect_status(connection)["embedding_calls"] == calls


def test_a_reimport_deletes_what_the_file_no_longer_has(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    path = write(tmp_path / "tools.jsonl", TOOLS)
    run_import(stack, path, tenant)

    code, out, _err = run_import(stack, write(path, TOOLS[:2]), tenant)

    assert code == 0 and "0 upserted, 1 deleted, 2 unchanged" in out
    assert not connection.hexists(keys.caps(tenant), "tool:PDF_URLTool")


def test_a_broken_line_is_named_and_deletes_nothing(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    path = write(tmp_path / "tools.jsonl", TOOLS)
    run_import(stack, path, tenant)

    code, out, err = run_import(stack, write(path, TOOLS[:2], extra="{not json\n"), tenant)

    assert code == 1
    assert f"rejected: {path}:3: is not JSON" in err
    assert "0 deleted" in out and "1 rejected" in out
    assert connection.hexists(keys.caps(tenant), "tool:PDF_URLTool")
