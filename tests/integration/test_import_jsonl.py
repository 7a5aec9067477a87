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

    assert code == 0  # the other lines are imported: only a wholly refused file exits 1
    assert f"rejected: {path}:3: is not JSON" in err
    assert "0 deleted" in out and "1 rejected" in out
    assert connection.hexists(keys.caps(tenant), "tool:PDF_URLTool")


# Written for another program: Python type names in the schema, a zero-width space pasted in.
DIALECT = {
    "id": "convertCurrency",
    "name": "convertCurrency",
    "description": "\u200bConvert an amount of money between two currencies.",
    "parameters": {
        "type": "dict",
        "properties": {
            "amount": {"type": "float", "description": "How much money."},
            "currencies": {"type": "tuple", "items": {"type": "String"}},
        },
        "required": ["amount"],
    },
    "category": "finance",
}
BAD = {
    "id": "sendSms",
    "name": "sendSms",
    "description": "Send a text message.",
    "parameters": {"type": "object", "properties": {"to": {"type": "strng"}}},
}


def test_good_and_dialect_lines_are_imported_and_the_bad_one_listed(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    path = write(tmp_path / "tools.jsonl", [TOOLS[0], DIALECT, BAD, TOOLS[1]])

    code, out, err = run_import(stack, path, tenant)

    assert code == 0, err
    assert "3 upserted, 0 deleted, 0 unchanged, 1 rejected" in out
    assert (
        f"rejected: {path}:3: field 'parameters.properties.to.type': 'strng' is not a JSON "
        "Schema type" in err
    )
    assert f"warning: {path}:2: parameters.type: type 'dict' read as 'object'" in err
    assert f"warning: {path}:2: description: removed 1 zero-width character (U+200B)" in err
    raw = connection.hget(keys.caps(tenant), "tool:convertCurrency")
    assert raw is not None
    stored = json.loads(raw)["capability"]
    assert stored["description"] == "Convert an amount of money between two currencies."
    assert stored["full_schema"]["type"] == "object"
    assert stored["full_schema"]["properties"]["currencies"] == {
        "type": "array",
        "items": {"type": "string"},
    }
    assert not connection.hexists(keys.caps(tenant), "tool:sendSms")
    version = int(out.rsplit("index version ", 1)[1])
    answer = Client(connection, tenant=tenant, timeout_s=20).discover(
        "convert 100 euros to yen", min_version=version
    )
    assert answer.ids[0] == "tool:convertCurrency"


def test_a_file_of_only_refused_lines_exits_1(
    stack: Stack, tmp_path: Path, tenant: str, connection: redis.Redis
) -> None:
    path = write(tmp_path / "tools.jsonl", [BAD], extra="[1, 2]\n")

    code, out, err = run_import(stack, path, tenant)

    assert code == 1
    assert "0 upserted, 0 deleted, 0 unchanged, 2 rejected" in out
    assert f"rejected: {path}:2: must be a JSON object" in err
    assert connection.hlen(keys.caps(tenant)) == 0
