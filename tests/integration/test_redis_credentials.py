"""A wrong or missing Redis password is said at once, naming the password as the problem: the
client and ``capdisc publish`` do not wait for Redis to "come back" (it is up, and no wait
makes the password right), nor ask whether the stack is running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capdisc.client import Client
from capdisc.errors import RedisCredentialsError
from capdisc.localredis import LocalRedis, start_redis
from capdisc_producers.supervisor import die_with_parent

from .conftest import EXAMPLES

pytestmark = pytest.mark.timeout(120)

#: Far beyond how long refusing takes: a client that waited for Redis would reach it.
PATIENCE_S = 60.0


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[LocalRedis]:
    server = start_redis(
        tmp_path / "redis",
        durable=False,
        password="the-right-password",
        preexec_fn=die_with_parent(signal.SIGTERM),
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_the_client_says_at_once_that_redis_refused_its_password(
    guarded: LocalRedis, password: str | None
) -> None:
    url = f"redis://:{password}@127.0.0.1:{guarded.port}/0" if password else guarded.url
    started = time.monotonic()

    with (
        Client.from_url(url, timeout_s=PATIENCE_S) as client,
        pytest.raises(RedisCredentialsError, match="password is wrong or missing"),
    ):
        client.discover("post a message")

    assert time.monotonic() - started < PATIENCE_S / 2


def test_publish_with_a_wrong_password_fails_at_once_instead_of_waiting(
    guarded: LocalRedis,
) -> None:
    url = f"redis://:wrong-password@127.0.0.1:{guarded.port}/0"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "capdisc_producers.cli", "publish", str(EXAMPLES)),
            *("--redis-url", url, "--tenant", "creds", "--timeout", str(PATIENCE_S)),
        ],
        capture_output=True,
        text=True,
        timeout=PATIENCE_S * 1.5,
    )

    assert done.returncode != 0
    assert "password is wrong or missing" in done.stderr
    assert "waiting up to" not in done.stderr + done.stdout
    assert "wrong-password" not in done.stderr + done.stdout
