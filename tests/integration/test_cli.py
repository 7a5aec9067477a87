"""The ``capdisc`` command against a running stack, and ``capdisc up`` from a fresh directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.localredis import start_redis

from .conftest import EXAMPLES, Stack, publish
from .upstack import UpProcess, start_up


def _outside_any_stack(redis_url: str | None = None) -> dict[str, str]:
    """This process's environment without capdisc's settings (so no stack is found), with
    ``redis_url`` as the Redis URL when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    if redis_url is not None:
        env["CAPDISC_REDIS_URL"] = redis_url
    return env


def _port_nothing_listens_on() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


__all__ = ["start_up"]  # the fixture, imported for pytest

CLI = [sys.executable, "-m", "capdisc_producers.cli"]


def run_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_discover_json_carries_version_and_ranked_capabilities(
    stack: Stack, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    result = run_cli(
        "discover",
        "open a pull request",
        "--json",
        "--tenant",
        tenant,
        "--min-version",
        str(report.index_version),
        env=stack.env,
    )

    answer = json.loads(result.stdout)
    assert answer["index_version"] == report.index_version
    assert answer["capabilities"][0]["id"] == "tool:github-create-pull-request"
    assert set(answer["capabilities"][0]) >= {"id", "kind", "name", "score"}


def test_status_json_reports_version_count_and_workers(stack: Stack) -> None:
    result = run_cli("status", "--json", env=stack.env)

    status = json.loads(result.stdout)
    assert {"index_version", "capabilities", "workers"} <= set(status)
    assert {w["kind"] for w in status["workers"]} == {"indexing", "discovery"}


def test_publish_of_a_broken_registry_exits_nonzero_naming_file_and_field(
    stack: Stack, registry: Path, tenant: str
) -> None:
    broken = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    broken.write_text(broken.read_text().replace("kind: tool", "kind: gadget"))

    result = run_cli("publish", str(registry), "--tenant", tenant, env=stack.env)

    assert result.returncode == 1
    assert f"rejected: {broken}: field 'kind': must be one of tool, skill" in result.stderr
    assert "upserted" in result.stdout


def test_commands_without_a_stack_say_how_to_start_one(tmp_path: Path) -> None:
    env = _outside_any_stack()

    result = run_cli("status", env=env, cwd=tmp_path)

    assert result.returncode == 2
    assert "make up" in result.stderr


@pytest.mark.timeout(180)
def test_up_reaches_ready_serves_from_the_project_directory_and_stops_cleanly(
    start_up: Callable[..., UpProcess],
) -> None:
    up = start_up()  # killed with everything it started at the end, pass or fail
    status = up.status()
    redis_url = up.redis_url

    up.process.send_signal(signal.SIGINT)

    assert up.process.wait(timeout=60) == 0
    assert any("Try:" in line and "discover" in line for line in up.output().splitlines())
    assert status["capabilities"] == len(list(EXAMPLES.rglob("CAPABILITY.yaml")))
    assert not up.stack_file.exists()
    for worker in status["workers"]:
        with pytest.raises(ProcessLookupError):
            os.kill(worker["pid"], 0)
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()


def test_delete_removes_a_capability_and_exits_1_naming_unknown_ids(
    stack: Stack, registry: Path, tenant: str
) -> None:
    publish(stack.url, registry, tenant)

    result = run_cli(
        "delete", "tool:stripe-refund", "tool:never-there", "--tenant", tenant, env=stack.env
    )

    assert result.returncode == 1, result.stderr
    assert "tool:stripe-refund: deleted" in result.stdout
    assert "tool:never-there: not found, nothing to delete" in result.stdout
    assert f"tenant '{tenant}' holds no tool:never-there" in result.stderr
    version = int(result.stdout.rsplit("index version ", 1)[1])
    answer = json.loads(
        run_cli(
            "discover",
            "refund a payment",
            "--json",
            "--tenant",
            tenant,
            "--min-version",
            str(version),
            env=stack.env,
        ).stdout
    )
    assert "tool:stripe-refund" not in [c["id"] for c in answer["capabilities"]]


def test_delete_all_empties_the_tenant_whatever_its_sources_and_leaves_other_tenants(
    stack: Stack, registry: Path, tenant: str, tmp_path: Path, connection: redis.Redis
) -> None:
    other = f"{tenant}-kept"
    publish(stack.url, registry, other)
    broken = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    broken.write_text(broken.read_text().replace("kind: tool", "kind: gadget"))
    publish(stack.url, registry, tenant)  # one manifest rejected, recorded
    catalog = tmp_path / "tools.jsonl"
    catalog.write_text(json.dumps({"id": "getWeather", "description": "Weather for a city."}))
    assert (
        run_cli("import", "jsonl", str(catalog), "--tenant", tenant, env=stack.env).returncode == 0
    )
    held = connection.hlen(keys.caps(tenant))

    result = run_cli("delete", "--all", "--tenant", tenant, env=stack.env)

    assert result.returncode == 0, result.stderr
    assert "1 rejected manifest(s) forgotten" in result.stdout
    assert f"{held} capabilities deleted from tenant '{tenant}'" in result.stdout
    status = json.loads(run_cli("status", "--json", env=stack.env).stdout)["tenants"]
    assert status[tenant]["capabilities"] == 0 and status[tenant]["manifest_errors"] == {}
    assert status[other]["capabilities"] == connection.hlen(keys.caps(other)) > 0
    again = run_cli("delete", "--all", "--tenant", tenant, env=stack.env)
    assert again.returncode == 0 and "nothing to delete" in again.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["tool:stripe-refund", "--all"], "give no ids and no --source with it"),
        (["--source", "mcp:x", "--all"], "give no ids and no --source with it"),
        (["tool:stripe-refund", "--source", "mcp:x"], "not both"),
        ([], "give capability ids, --source, or --all"),
    ],
)
def test_delete_names_what_to_give_when_its_arguments_do_not_fit(
    stack: Stack, tenant: str, args: list[str], says: str
) -> None:
    result = run_cli("delete", *args, "--tenant", tenant, env=stack.env)

    assert result.returncode == 2 and says in result.stderr


def test_delete_all_of_a_tenant_never_published_to_exits_1_naming_it(
    stack: Stack, tenant: str
) -> None:
    result = run_cli("delete", "--all", "--tenant", tenant, env=stack.env)

    assert result.returncode == 1 and f"tenant {tenant!r} is unknown" in result.stderr


def test_a_redis_that_never_answers_is_one_error_saying_so_not_a_traceback(tmp_path: Path) -> None:
    # Accepts connections (the kernel's backlog) and never answers: a TLS handshake, as a
    # rediss:// URL starts with, times out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        env = _outside_any_stack(f"rediss://127.0.0.1:{port}/0")

        done = run_cli("status", env=env, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: cannot reach Redis (Timeout connecting to server)")
    assert "a rediss:// URL needs a Redis that speaks TLS" in done.stderr


def test_a_redis_url_option_whose_password_ends_early_is_one_error_naming_the_option(
    tmp_path: Path,
) -> None:
    env = _outside_any_stack()

    done = run_cli("status", "--redis-url", "redis://:Zq/Zq@127.0.0.1:1/0", env=env, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Zq" not in done.stderr
    assert done.stderr.startswith("error: the Redis URL has a '#', '/', '?' or '@' in its password")
    assert "--redis-url" in done.stderr


def test_a_command_that_first_meets_redis_sending_a_task_says_redis_is_unreachable(
    tmp_path: Path,
) -> None:
    # reconcile's first contact with Redis is the task it sends (through kombu, which wraps
    # the connection error in its own)
    env = _outside_any_stack(f"redis://127.0.0.1:{_port_nothing_listens_on()}/0")

    done = run_cli("reconcile", env=env, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: cannot reach Redis (Error 111 connecting to")
    assert "is the stack running? (make up)" in done.stderr


@pytest.mark.timeout(180)
def test_a_redis_up_does_not_run_being_down_is_not_said_to_be_restarted_by_up(
    start_up: Callable[..., UpProcess], tmp_path: Path
) -> None:
    server = start_redis(tmp_path / "external-redis", durable=False)
    try:
        up = start_up(env={"CAPDISC_REDIS_URL": server.url})
        server.stop()

        done = up.cli("status")
    finally:
        server.stop()

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: cannot reach Redis")
    assert "being restarted" not in done.stderr
    assert "uses a Redis it does not run" in done.stderr and "start that Redis" in done.stderr


def test_a_command_sending_a_task_to_a_redis_that_never_answers_gives_up_saying_so(
    tmp_path: Path,
) -> None:
    # a Redis that hangs (stopped, or across a partition) accepts connections and never answers
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        env = _outside_any_stack(f"redis://127.0.0.1:{port}/0")

        done = run_cli("reconcile", env=env, cwd=tmp_path)  # 60 s, else TimeoutExpired

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: cannot reach Redis (Timeout")


@pytest.mark.timeout(180)
def test_up_given_a_redis_that_is_down_says_to_start_that_redis(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{_port_nothing_listens_on()}/0"
    shutil.copytree(EXAMPLES, tmp_path / "examples" / "registry")
    up = UpProcess(tmp_path, env={"CAPDISC_REDIS_URL": url})
    try:
        code = up.process.wait(timeout=120)
    finally:
        up.kill_all()

    output = up.output()
    assert code == 2, output
    assert "Traceback" not in output and "make up" not in output
    assert f"error: cannot reach the Redis at {url} given in CAPDISC_REDIS_URL" in output
    assert "start that Redis, or unset CAPDISC_REDIS_URL" in output
