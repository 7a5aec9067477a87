"""Finding the running stack from any working directory: ``Client.from_stack()`` and the
command's ``--stack DIR`` (the same as ``CAPDISC_STACK``). No Redis is reached: a client
connects on its first request, and the stack files here name a port nothing listens on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from capdisc.client import Client, no_answer_message, tenant_of
from capdisc.errors import StackNotFoundError
from capdisc.identity import auth


def make_stack(project: Path, port: int, *, token: str | None = None) -> Path:
    """A stack file in ``project`` as a running ``capdisc up`` writes it (this process is its
    ``up``), with a password file and, when given, an admin token file."""
    state = project / ".capdisc"
    (state / "secrets").mkdir(parents=True)
    password_file = state / "secrets" / "redis.password"
    password_file.write_text(f"secret-{port}\n")
    data: dict[str, Any] = {
        "redis_url": f"redis://127.0.0.1:{port}/0",
        "pid": os.getpid(),
        "redis_password_file": str(password_file),
    }
    if token:
        token_file = state / "secrets" / "admin.token"
        token_file.write_text(token + "\n")
        data["token_file"] = str(token_file)
    (state / "stack.json").write_text(json.dumps(data))
    return project


def where(client: Client) -> tuple[Any, Any, Any]:
    kwargs = client.redis.connection_pool.connection_kwargs
    return kwargs["host"], kwargs["port"], kwargs["password"]


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no stack above it, and no stack named in the environment."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    monkeypatch.chdir(directory)
    for name in ("CAPDISC_STACK", "CAPDISC_TOKEN", "CAPDISC_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return directory


def test_from_stack_finds_the_stack_of_the_directory_it_is_given(
    tmp_path: Path, elsewhere: Path
) -> None:
    project = make_stack(tmp_path / "project", 7001)

    with Client.from_stack(project) as client:
        assert where(client) == ("127.0.0.1", 7001, "secret-7001")


def test_from_stack_finds_the_stack_capdisc_stack_names(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPDISC_STACK", str(make_stack(tmp_path / "project", 7002)))

    with Client.from_stack() as client:
        assert where(client)[1] == 7002


def test_the_directory_given_wins_over_capdisc_stack(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPDISC_STACK", str(make_stack(tmp_path / "named", 7003)))
    given = make_stack(tmp_path / "given", 7004)

    with Client.from_stack(given) as client:
        assert where(client)[1] == 7004


def test_from_stack_searches_up_from_the_working_directory(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_stack(tmp_path / "project", 7005)
    (project / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(project / "a" / "b")

    with Client.from_stack() as client:
        assert where(client)[1] == 7005


def test_from_stack_without_a_running_stack_says_how_to_name_one(elsewhere: Path) -> None:
    with pytest.raises(StackNotFoundError, match="CAPDISC_STACK") as raised:
        Client.from_stack()

    assert str(elsewhere) in str(raised.value)
    assert "Client.from_url" in str(raised.value)
    assert "CAPDISC_REDIS_URL" not in str(raised.value)  # from_stack does not read it


def test_from_stack_presents_the_admin_token_the_stack_wrote(
    tmp_path: Path, elsewhere: Path
) -> None:
    project = make_stack(tmp_path / "project", 7006, token="header.payload.signature")

    with Client.from_stack(project) as client:
        assert client.token == "header.payload.signature"


def test_capdisc_token_wins_over_the_stacks_admin_token(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = make_stack(tmp_path / "project", 7007, token="stack.admin.token")
    monkeypatch.setenv("CAPDISC_TOKEN", "caller.own.token")

    with Client.from_stack(project) as client:
        assert client.token == "caller.own.token"


def issued(tenant: str) -> str:
    now = time.time()
    keyring = auth.Keyring([auth.new_key(now)])
    grants = ["admin"] if tenant == auth.ALL_TENANTS else ["discover"]
    return auth.issue(keyring, tenant=tenant, user="u", grants=grants, ttl_s=60, now=now)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(issued("acme"), "acme", id="tenant"),
        pytest.param(issued(auth.ALL_TENANTS), None, id="every-tenant"),
        pytest.param("not-a-token", None, id="malformed"),
        pytest.param("a.!!!.c", None, id="payload-not-base64"),
        pytest.param(None, None, id="none"),
    ],
)
def test_tenant_of_reads_a_tokens_tenant_as_peek_does(
    token: str | None, expected: str | None
) -> None:
    assert tenant_of(token) == expected


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--stack", "{dir}", "status"], id="global"),
        pytest.param(["status", "--stack", "{dir}"], id="command"),
        pytest.param(["mcp", "--stack", "{dir}"], id="mcp"),
    ],
)
def test_the_stack_option_names_where_the_command_looks(
    argv: list[str], tmp_path: Path, elsewhere: Path
) -> None:
    project = tmp_path / "no-stack-here"
    project.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "capdisc_producers.cli", *(a.format(dir=project) for a in argv)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert f"no running capdisc stack found from {project}" in done.stderr


@pytest.mark.parametrize(
    ("seen", "says"),
    [
        ("0", "(0 discovery workers seen alive); start one"),
        ("2", "though 2 discovery worker(s) are alive: busy or blocked"),
        ("?", "check that a discovery worker runs"),
    ],
)
def test_an_unanswered_request_is_explained_by_the_workers_seen(seen: str, says: str) -> None:
    message = no_answer_message(5.0, seen)

    assert message.startswith("no discovery worker answered within 5.0 s") and says in message
