"""``capdisc up`` keeps its secrets: a keyring, an admin token for the CLI in the project and a
Redis password, each 0600 under ``.capdisc/secrets/``; Redis refuses clients without the
password; the password is in no stored or printed URL and on no command line; the workers
require tokens unless ``CAPDISC_AUTH=off``."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from capdisc.client import Client
from capdisc.errors import AuthError
from capdisc.identity import auth

from .upstack import UpProcess, start_up

__all__ = ["start_up"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(180)

Start = Callable[..., UpProcess]
SECRETS = ("auth_keys.json", "admin.token", "redis.password")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_up_writes_private_secrets_and_redis_refuses_a_client_without_the_password(
    start_up: Start,
) -> None:
    up = start_up()
    secrets = up.project / ".capdisc" / "secrets"
    password = (secrets / "redis.password").read_text().strip()
    stack = json.loads(up.stack_file.read_text())
    port = int(stack["redis_url"].rsplit(":", 1)[1].split("/")[0])

    assert mode(secrets) == 0o700
    assert {name: mode(secrets / name) for name in SECRETS} == dict.fromkeys(SECRETS, 0o600)
    assert mode(up.project / ".capdisc" / "redis" / "auth.conf") == 0o600
    assert stack["auth"] is True and "@" not in stack["redis_url"]
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, socket_connect_timeout=2).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, password="guess", socket_connect_timeout=2).ping()
    assert up.connection().ping()

    status = up.cli("status")
    assert status.returncode == 0, status.stderr
    printed = [
        up.stack_file.read_text(),
        up.output(),
        status.stdout,
        status.stderr,
        *(
            log.read_text(errors="replace")
            for log in (up.project / ".capdisc" / "logs").glob("*.log")
        ),
    ]
    assert not any(password in text for text in printed)
    for pid in up.children().values():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert password not in cmdline
        assert password not in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def test_up_turns_auth_on_and_the_cli_in_the_project_uses_the_admin_token(start_up: Start) -> None:
    up = start_up()
    keyring = auth.load_keyring(up.project / ".capdisc" / "secrets" / "auth_keys.json")
    admin = auth.verify(up.token, keyring, time.time())

    found = up.cli("discover", "post a message to the team's slack channel", "--json")
    forged = up.cli("discover", "post a message", "--json", "--token", "x.y.z")

    assert admin.allows("admin") and admin.tenant == auth.ALL_TENANTS
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["capabilities"][0]["id"] == "tool:slack-post-message"
    assert forged.returncode == 2 and "malformed" in forged.stderr and forged.stdout == ""
    with pytest.raises(AuthError, match="no identity token"):
        Client(up.connection(), tenant="default", timeout_s=10).discover("post a message")


def test_up_with_auth_off_serves_claimed_identities_and_says_so(start_up: Start) -> None:
    up = start_up(env={"CAPDISC_AUTH": "off"})

    answer = Client(up.connection(), tenant="default", timeout_s=20).discover("post to slack")

    assert answer.capabilities
    assert "auth is OFF" in up.output()
    assert json.loads(up.stack_file.read_text())["auth"] is False
    assert up.token is None or "token_file" not in json.loads(up.stack_file.read_text())
