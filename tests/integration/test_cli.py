"""The ``capdisc`` command against a running stack, and ``capdisc up`` from a fresh directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from .conftest import EXAMPLES, Stack, publish

CLI = [sys.executable, "-m", "capdisc_producers.cli"]


def run_cli(*args: str, env: dict[str, str], cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_discover_json_carries_version_and_ranked_capabilities(
    stack: Stack, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    result = run_cli("discover", "open a pull request", "--json", "--tenant", tenant,
                     "--min-version", str(report.index_version), env=stack.env)

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}

    result = run_cli("status", env=env, cwd=tmp_path)

    assert result.returncode == 2
    assert "make up" in result.stderr


@pytest.mark.timeout(180)
def test_up_reaches_ready_serves_from_the_project_directory_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples" / "registry")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env.update(CAPDISC_EMBEDDER="hashing", PYTHONUNBUFFERED="1")
    up = subprocess.Popen([*CLI, "up"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        lines = _read_until(up, "capdisc is ready")
        status = json.loads(run_cli("status", "--json", env=env, cwd=tmp_path).stdout)
        stack_file = json.loads((tmp_path / ".capdisc" / "stack.json").read_text())
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)

    assert any("Try:" in line and "discover" in line for line in lines)
    assert status["capabilities"] == len(list(EXAMPLES.rglob("CAPABILITY.yaml")))
    assert not (tmp_path / ".capdisc" / "stack.json").exists()
    for worker in status["workers"]:
        with pytest.raises(ProcessLookupError):
            os.kill(worker["pid"], 0)
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(stack_file["redis_url"], socket_connect_timeout=1).ping()


def _read_until(process: subprocess.Popen[str], marker: str) -> list[str]:
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError("capdisc up exited before it was ready:\n" + "".join(lines))


def test_delete_removes_a_capability_and_reports_unknown_ids(
    stack: Stack, registry: Path, tenant: str
) -> None:
    publish(stack.url, registry, tenant)

    result = run_cli("delete", "tool:stripe-refund", "tool:never-there", "--tenant", tenant,
                     env=stack.env)

    assert result.returncode == 0, result.stderr
    assert "tool:stripe-refund: deleted" in result.stdout
    assert "tool:never-there: not found, nothing to delete" in result.stdout
    version = int(result.stdout.rsplit("index version ", 1)[1])
    answer = json.loads(run_cli("discover", "refund a payment", "--json", "--tenant", tenant,
                                "--min-version", str(version), env=stack.env).stdout)
    assert "tool:stripe-refund" not in [c["id"] for c in answer["capabilities"]]
