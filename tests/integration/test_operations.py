"""Operating a stack with the ``capdisc`` command and Celery's: the version, tool definitions
from discover, the health probe, dropping and replaying dead letters by id, exit status 1 for
what a command names and capdisc does not hold, and ``celery inspect ping`` finding the
running stack through its stack file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.localredis import free_port
from capdisc.registry.deadletters import dead_letter, list_dead_letters

from .conftest import Stack, publish
from .private import PrivateStack
from .test_cli import run_cli
from .test_dead_letters import dead_letter_of, undecodable

BIN = Path(sys.executable).parent


def test_the_installed_command_prints_its_version() -> None:
    result = subprocess.run(
        [str(BIN / "capdisc"), "--version"], capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"capdisc {metadata.version('capdisc')}\n"


# -- discover --format -------------------------------------------------------------------------


@pytest.mark.parametrize("tool_format", ["openai-chat", "openai-responses", "anthropic", "mcp"])
def test_discover_prints_the_answers_tool_definitions_in_the_format_asked(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis, tool_format: str
) -> None:
    version = publish(stack.url, registry, tenant).index_version
    asked = ("post a message to the team's slack channel", "--tenant", tenant)

    alone = run_cli(
        "discover", *asked, "--min-version", str(version), "--format", tool_format, env=stack.env
    )
    inside = run_cli("discover", *asked, "--format", tool_format, "--json", env=stack.env)

    expected = Client(connection, tenant=tenant, timeout_s=20).discover(
        asked[0], tool_format=tool_format, min_version=version
    )
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout) == expected.tools
    assert json.loads(inside.stdout)["tools"] == expected.tools
    assert "slack-post-message" in json.dumps(expected.tools)


def test_discover_refuses_a_format_it_does_not_know(stack: Stack) -> None:
    result = run_cli("discover", "post a message", "--format", "gemini", env=stack.env)

    assert result.returncode == 2
    assert "Invalid value for '--format'" in result.stderr


# -- status --check ----------------------------------------------------------------------------


def test_the_probe_passes_on_a_stack_that_can_serve(stack: Stack) -> None:
    human = run_cli("status", "--check", env=stack.env)
    as_json = run_cli("status", "--check", "--json", env=stack.env)

    assert human.returncode == 0, human.stdout + human.stderr
    assert human.stdout.startswith("healthy: Redis answers")
    verdict = json.loads(as_json.stdout)
    assert (verdict["healthy"], verdict["failed"]) == (True, [])
    assert verdict["workers"]["discovery"] >= 1 and verdict["workers"]["indexing"] >= 1


def test_the_probe_fails_one_line_per_missing_kind_of_worker(tmp_path: Path) -> None:
    with PrivateStack(tmp_path, durable=False) as private:  # Redis, and no worker
        result = run_cli("status", "--check", "--redis-url", private.url, env=private.env)

    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed: ")]
    assert [line.split(":")[1].strip() for line in failed] == [
        "discovery workers",
        "indexing workers",
    ]
    assert "healthy" not in result.stdout


def test_the_probe_fails_when_redis_does_not_answer_or_no_stack_is_found(
    stack: Stack, tmp_path: Path
) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}

    down = run_cli("status", "--check", "--redis-url", nobody, env=stack.env)
    nowhere = run_cli("status", "--check", env=env, cwd=tmp_path)

    assert down.returncode == 1
    assert down.stdout.startswith(f"failed: redis: {nobody} did not answer")
    assert nowhere.returncode == 1
    assert nowhere.stdout.startswith("failed: redis: no running capdisc stack found")


# -- dead letters: drop, and replay with one outcome per id -------------------------------------


def request_letter(connection: redis.Redis) -> str:
    """A dead-lettered discovery request, as a discovery worker writes one; its id."""
    dead_letter(
        connection,
        '{"payload": "\\\\xff"}',
        "discovery request refused: field 'payload' is not UTF-8 text",
        source=keys.DISCOVERY_REQUESTS,
        entry_id=f"{uuid.uuid4().int % 10**9}-0",
    )
    return str(connection.xrevrange(keys.DEADLETTERS, count=1)[0][0].decode())


def listed(connection: redis.Redis) -> set[str]:
    return {d.entry_id for d in list_dead_letters(connection, 100_000)}


def test_drop_removes_named_dead_letters_and_names_the_unknown_ones(
    stack: Stack, connection: redis.Redis
) -> None:
    event = dead_letter_of(stack, connection, undecodable(f"drop-{uuid.uuid4().hex[:8]}"))
    request = request_letter(connection)

    result = run_cli("dlq", "drop", event, request, "1-999999", "not-an-id", env=stack.env)

    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{event}: dropped",
        f"{request}: dropped",
        "1-999999: not found",
        "not-an-id: not found",
    ]
    assert "no dead letter with id 1-999999, not-an-id" in result.stderr
    assert not {event, request} & listed(connection)


def test_drop_of_dead_letters_that_all_exist_exits_0(stack: Stack, connection: redis.Redis) -> None:
    request = request_letter(connection)

    result = run_cli("dlq", "drop", request, env=stack.env)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{request}: dropped\n"


def test_drop_all_empties_the_stream_and_says_so_when_it_is_empty(tmp_path: Path) -> None:
    with PrivateStack(tmp_path, durable=False) as private:
        connection = private.connection()
        dead_letter(connection, '{"type": "upsert"}', "event field 'tenant' is missing")
        request = request_letter(connection)
        first = str(connection.xrange(keys.DEADLETTERS, count=1)[0][0].decode())
        url = ("--redis-url", private.url)

        dropped = run_cli("dlq", "drop", "--all", *url, env=private.env)
        again = run_cli("dlq", "drop", "--all", *url, env=private.env)
        neither = run_cli("dlq", "drop", *url, env=private.env)

        assert dropped.returncode == 0, dropped.stderr
        assert dropped.stdout.splitlines() == [f"{first}: dropped", f"{request}: dropped"]
        assert connection.xlen(keys.DEADLETTERS) == 0
        assert (again.returncode, again.stdout) == (0, "no dead letters\n")
        assert neither.returncode == 2 and "give the entry ids to drop, or --all" in neither.stderr


def test_replay_says_per_id_what_became_of_it_and_exits_1_for_the_ones_that_did_not_go(
    stack: Stack, connection: redis.Redis
) -> None:
    payload = undecodable(f"dlq-{uuid.uuid4().hex[:8]}")
    event = dead_letter_of(stack, connection, payload)
    request = request_letter(connection)

    result = run_cli("dlq", "replay", event, request, "1-999999", env=stack.env)

    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{event}: replayed",
        f"{request}: refused: a discovery request",
        "1-999999: not found",
    ]
    assert "no dead letter with id 1-999999" in result.stderr
    assert f"dead letter {request} is a discovery request" in result.stderr
    assert event not in listed(connection) and request in listed(connection)
    run_cli("dlq", "drop", request, env=stack.env)


# -- exit status 1 for what a command names and capdisc does not hold ---------------------------


def test_delete_and_reindex_of_unknown_ids_exit_1_naming_them_after_doing_the_rest(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    publish(stack.url, registry, tenant)
    at = ("--tenant", tenant)

    reindexed = run_cli("reindex", "tool:slack-post-message", "tool:nope", *at, env=stack.env)
    deleted = run_cli("delete", "tool:stripe-refund", "tool:nope", *at, env=stack.env)
    known = run_cli("delete", "tool:github-create-pull-request", *at, env=stack.env)

    assert reindexed.returncode == 1
    assert "tool:slack-post-message: reindexed" in reindexed.stdout
    assert "tool:nope: not found, nothing to reindex" in reindexed.stdout
    assert deleted.returncode == 1
    assert "tool:stripe-refund: deleted" in deleted.stdout
    assert f"error: tenant '{tenant}' holds no tool:nope" in deleted.stderr
    assert connection.hget(keys.caps(tenant), "tool:stripe-refund") is None
    assert known.returncode == 0, known.stderr


def test_commands_naming_an_unknown_tenant_or_session_exit_1(stack: Stack, tenant: str) -> None:
    at = ("--tenant", tenant)  # nothing was ever published to it

    found = run_cli("discover", "post a message", *at, env=stack.env)
    flagged = run_cli("flags", "list", *at, env=stack.env)
    rebuilt = run_cli("reindex", "--all", *at, "--timeout", "5", env=stack.env)
    shown = run_cli("session", "show", "nobody-here", *at, env=stack.env)

    for result in (found, flagged, rebuilt, shown):
        assert result.returncode == 1, result.stderr
        assert tenant in result.stderr and "Traceback" not in result.stderr
    assert "is unknown: nothing was ever published to it" in flagged.stderr
    assert "is unknown" in rebuilt.stderr
    assert "has no registry" in shown.stderr


def test_deleting_or_reindexing_ids_of_an_unknown_tenant_does_not_create_it(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    at = ("--tenant", tenant)  # nothing was ever published to it: a misspelt name

    deleted = run_cli("delete", "tool:stripe-refund", *at, env=stack.env)
    reindexed = run_cli("reindex", "tool:stripe-refund", *at, env=stack.env)

    for result in (deleted, reindexed):
        assert result.returncode == 1, result.stderr
        assert f"tenant {tenant!r} is unknown: nothing was ever published to it" in result.stderr
    assert not connection.sismember(keys.TENANTS, tenant)


# -- celery's own commands find the running stack -----------------------------------------------


def indexing_node(stack: Stack) -> str:
    """The Celery node name of the suite's indexing worker."""
    for process in stack.processes:
        argv = [str(a) for a in process.args]  # type: ignore[union-attr]
        if "celery" in argv and "-n" in argv and process.poll() is None:
            return argv[argv.index("-n") + 1].replace("%h", socket.gethostname())
    raise AssertionError("the suite's indexing worker is not running")


def test_celery_inspect_ping_run_in_a_project_asks_the_running_stacks_workers(
    stack: Stack, tmp_path: Path
) -> None:
    (tmp_path / ".capdisc").mkdir()
    (tmp_path / ".capdisc" / "stack.json").write_text(
        json.dumps({"redis_url": stack.url, "pid": os.getpid(), "auth": False})
    )
    env = {k: v for k, v in stack.env.items() if k != "CAPDISC_REDIS_URL"}
    node = indexing_node(stack)
    ping = ["inspect", "ping", "--destination", node, "--timeout", "30"]

    result = subprocess.run(
        [str(BIN / "celery"), "-A", "capdisc_workers.celery_app", *ping],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{node}: OK" in result.stdout and "pong" in result.stdout  # only that Redis has it
