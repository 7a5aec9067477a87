"""Finding the running stack from its ``.capdisc/stack.json``, and the settings of a worker
started in the project, which joins it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capdisc.errors import StackNotFoundError
from capdisc.settings import Settings
from capdisc.stackfile import joining_stack
from capdisc_producers.stack import find_stack, resolve_access, resolve_redis_url, without_password


def write_stack_file(project: Path, pid: int) -> None:
    state = project / ".capdisc"
    state.mkdir(parents=True)
    (state / "stack.json").write_text(
        json.dumps({"redis_url": "redis://127.0.0.1:7/0", "pid": pid})
    )


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_stack_file_of_a_running_up_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    write_stack_file(tmp_path, os.getpid())
    (tmp_path / "a" / "b").mkdir(parents=True)

    assert resolve_redis_url(None, {}, tmp_path / "a" / "b") == "redis://127.0.0.1:7/0"


def test_a_stack_file_left_by_a_killed_up_is_not_a_running_stack(tmp_path: Path) -> None:
    write_stack_file(tmp_path, dead_pid())

    assert find_stack(tmp_path) is None
    with pytest.raises(StackNotFoundError):
        resolve_redis_url(None, {}, tmp_path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json", "stack.json is damaged (not JSON); remove it"),
        (b"\xff\xfe", "stack.json is damaged (not JSON); remove it"),
        (b"[1, 2]", "stack.json is damaged (not a JSON object with a numeric pid); remove it"),
        (
            b'{"redis_url": "redis://127.0.0.1:7/0", "pid": "x"}',
            "stack.json is damaged (not a JSON object with a numeric pid); remove it",
        ),
        (b'{"pid": null}', "stack.json names no redis_url; remove it"),
        (b'{"redis_url": "redis://127.0.0.1:7/0", "pid": PID}', "which no longer runs"),
    ],
    ids=["not json", "not utf-8", "a list", "a pid of text", "no url", "a dead pid"],
)
def test_a_stack_file_that_names_no_running_stack_says_why(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    (tmp_path / ".capdisc").mkdir()
    dead = str(dead_pid()).encode()
    (tmp_path / ".capdisc" / "stack.json").write_bytes(content.replace(b"PID", dead))

    with pytest.raises(StackNotFoundError) as info:
        resolve_redis_url(None, {}, tmp_path)

    assert f"no running capdisc stack found from {tmp_path} ({tmp_path}/.capdisc/" in str(
        info.value
    )
    assert reason.replace("PID", dead.decode()) in str(info.value)
    assert find_stack(tmp_path) is None


def test_the_stack_files_password_and_admin_token_go_only_to_the_stacks_redis(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / ".capdisc" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "redis.password").write_text("pw-123\n")
    (secrets / "admin.token").write_text("a.b.c\n")
    (tmp_path / ".capdisc" / "stack.json").write_text(
        json.dumps(
            {
                "redis_url": "redis://127.0.0.1:7/0",
                "pid": os.getpid(),
                "auth": True,
                "redis_password_file": str(secrets / "redis.password"),
                "token_file": str(secrets / "admin.token"),
                "auth_keys_file": str(secrets / "auth_keys.json"),
            }
        )
    )

    here = resolve_access(None, None, {}, tmp_path)
    elsewhere = resolve_access(None, None, {"CAPDISC_REDIS_URL": "redis://other:6379/0"}, tmp_path)
    explicit = resolve_access(None, "x.y.z", {}, tmp_path)

    assert (here.redis_url, here.token, here.auth) == (
        "redis://:pw-123@127.0.0.1:7/0",
        "a.b.c",
        True,
    )
    assert here.keys_file == secrets / "auth_keys.json"
    assert (elsewhere.redis_url, elsewhere.token) == ("redis://other:6379/0", None)
    assert explicit.token == "x.y.z"
    assert without_password("redis://user:pw@host:1/0") == "redis://user@host:1/0"


def running_stack_file(project: Path, **fields: object) -> None:
    state = project / ".capdisc"
    state.mkdir(parents=True, exist_ok=True)
    data = {"redis_url": "redis://127.0.0.1:7/0", "pid": os.getpid(), **fields}
    (state / "stack.json").write_text(json.dumps(data))


def test_a_worker_started_in_the_project_joins_the_running_stack(tmp_path: Path) -> None:
    password = tmp_path / "redis.password"
    password.write_text("pw-9\n")
    keyring = tmp_path / "auth_keys.json"
    running_stack_file(
        tmp_path, auth=True, redis_password_file=str(password), auth_keys_file=str(keyring)
    )
    (tmp_path / "sub").mkdir()

    joined = joining_stack(Settings(), {}, tmp_path / "sub")

    assert joined.redis_url == "redis://:pw-9@127.0.0.1:7/0"
    assert (joined.auth, joined.auth_keys_file) == (True, keyring)


def test_the_environment_or_the_settings_naming_a_redis_win_over_the_stack(
    tmp_path: Path,
) -> None:
    running_stack_file(tmp_path, auth=True)
    named = Settings(redis_url="redis://elsewhere:6379/0")

    from_env = joining_stack(Settings(), {"CAPDISC_REDIS_URL": "redis://x:1/0"}, tmp_path)

    assert from_env == Settings()
    assert joining_stack(named, {}, tmp_path) == named


def test_settings_that_turn_auth_off_keep_it_off_in_the_stack(tmp_path: Path) -> None:
    running_stack_file(tmp_path, auth=True, auth_keys_file=str(tmp_path / "k.json"))

    joined = joining_stack(Settings(auth=False), {}, tmp_path)

    assert (joined.redis_url, joined.auth) == ("redis://127.0.0.1:7/0", False)


def test_without_a_stack_file_the_settings_stay_as_they_are(tmp_path: Path) -> None:
    assert joining_stack(Settings(), {}, tmp_path / "nowhere") == Settings()


def test_a_worker_beside_a_stale_stack_file_is_told_which_file_and_what_to_do(
    tmp_path: Path,
) -> None:
    write_stack_file(tmp_path, pid := dead_pid())
    (tmp_path / "sub").mkdir()

    with pytest.raises(StackNotFoundError) as refused:
        joining_stack(Settings(), {}, tmp_path / "sub")

    message = str(refused.value)
    assert str(tmp_path / ".capdisc" / "stack.json") in message
    assert f"pid {pid}, which no longer runs" in message
    assert "capdisc up" in message and "CAPDISC_REDIS_URL" in message


def test_a_stale_stack_file_is_no_matter_when_a_redis_is_named(tmp_path: Path) -> None:
    write_stack_file(tmp_path, dead_pid())
    named = Settings(redis_url="redis://elsewhere:6379/0")

    assert joining_stack(named, {}, tmp_path) == named
    assert joining_stack(Settings(), {"CAPDISC_REDIS_URL": "redis://x:1/0"}, tmp_path) == (
        Settings()
    )


def test_a_discovery_worker_beside_a_stale_stack_file_does_not_start(tmp_path: Path) -> None:
    """Started by hand in the project, it joins the stack as the indexing workers do: a stale
    stack file stops it with the reason (exit 2), before it connects anywhere."""
    write_stack_file(tmp_path, dead_pid())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}

    done = subprocess.run(
        [sys.executable, "-m", "capdisc_workers.discovery"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )

    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(x) for x in done.stderr.splitlines() if "worker_not_started" in x]
    assert str(tmp_path / ".capdisc" / "stack.json") in line["reason"]
    assert "CAPDISC_REDIS_URL" in line["reason"]


def test_a_process_started_elsewhere_finds_the_stack_named_by_capdisc_stack(
    tmp_path: Path,
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write_stack_file(project, os.getpid())
    elsewhere.mkdir()

    assert resolve_redis_url(None, {"CAPDISC_STACK": str(project)}, elsewhere) == (
        "redis://127.0.0.1:7/0"
    )
    assert joining_stack(Settings(), {"CAPDISC_STACK": str(project)}, elsewhere).redis_url == (
        "redis://127.0.0.1:7/0"
    )
    with pytest.raises(StackNotFoundError, match="CAPDISC_STACK"):
        resolve_redis_url(None, {}, elsewhere)
