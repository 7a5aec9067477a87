"""``capdisc up`` run by a test as a process of its own, in a temporary project directory with a
copy of the example registry. Every process it started is gone when the test ends, pass or fail:
the fixture stops ``up`` (SIGTERM, then SIGKILL) and then kills any child it ever saw that is
still alive; and ``up`` gets SIGTERM from the kernel if the test process itself dies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc.settings import with_password
from capdisc_producers.supervisor import die_with_parent

from .conftest import EXAMPLES
from .conftest import wait_for as wait_for  # re-exported for the tests of up

CLI = [sys.executable, "-m", "capdisc_producers.cli"]
READY = "capdisc is ready"
#: What the command line of a process ``up`` starts contains (a recorded pid that no longer
#: shows one of these was reused by another process and is left alone).
CHILD_MARKERS = ("redis-server", "capdisc_workers")


def up_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env.update(
        CAPDISC_EMBEDDER="hashing",
        PYTHONUNBUFFERED="1",
        CAPDISC_HEARTBEAT_INTERVAL_S="0.5",
        CAPDISC_WATCH_DEBOUNCE_MS="100",
    )
    return env


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class UpProcess:
    """One ``capdisc up`` and every child pid it was seen to have."""

    def __init__(
        self, project: Path, *, ignore_sigint: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.project = project
        self.output_path = project / "up.out"
        self.env = {**up_env(), **(env or {})}
        self.seen: set[int] = set()
        with self.output_path.open("ab") as out:
            # as from a script's background job: SIGINT ignored; dies with the test process
            self.process = subprocess.Popen(
                [*CLI, "up"],
                cwd=project,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(
                    signal.SIGTERM, _ignore_sigint if ignore_sigint else None
                ),
            )

    @property
    def stack_file(self) -> Path:
        return self.project / ".capdisc" / "stack.json"

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def wait_for_output(self, marker: str, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.output()
            if marker in text:
                return text
            if self.process.poll() is not None:
                raise AssertionError(
                    f"capdisc up exited ({self.process.returncode}) before "
                    f"printing {marker!r}:\n{self.output()}"
                )
            time.sleep(0.05)
        raise AssertionError(
            f"capdisc up did not print {marker!r} in {timeout_s} s:\n{self.output()}"
        )

    def children(self) -> dict[str, int]:
        """The child pids ``stack.json`` names now (remembered for the cleanup)."""
        try:
            children: dict[str, int] = json.loads(self.stack_file.read_text())["children"]
        except (OSError, ValueError, KeyError):
            return {}
        self.seen.update(children.values())
        return children

    @property
    def redis_url(self) -> str:
        """The stack's Redis URL, with the password from the file ``stack.json`` names."""
        stack = json.loads(self.stack_file.read_text())
        password_file = stack.get("redis_password_file")
        if not password_file:
            return str(stack["redis_url"])
        return with_password(str(stack["redis_url"]), Path(password_file).read_text().strip())

    @property
    def token(self) -> str | None:
        """The admin token ``up`` wrote for the CLI (None with auth off)."""
        path = self.project / ".capdisc" / "secrets" / "admin.token"
        return path.read_text().strip() if path.exists() else None

    def connection(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_connect_timeout=1.0, socket_timeout=5.0)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            env=self.env,
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def status(self) -> dict[str, Any]:
        result = self.cli("status", "--json")
        assert result.returncode == 0, result.stderr
        status: dict[str, Any] = json.loads(result.stdout)
        return status

    def kill_all(self) -> None:
        """Stop ``up`` (SIGTERM, SIGKILL after 20 s), then kill any child still alive."""
        self.children()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.seen:
            if alive(pid) and _is_our_child(pid):
                os.kill(pid, signal.SIGKILL)


def _is_our_child(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return any(marker in cmdline for marker in CHILD_MARKERS)


@contextmanager
def running_up(project: Path) -> Iterator[UpProcess]:
    """``capdisc up`` (auth on, as ``make up``) in ``project`` with ``examples/registry``
    copied there, ready; stopped with every child at the end, pass or fail."""
    shutil.copytree(EXAMPLES, project / "examples" / "registry")
    process = UpProcess(project)
    try:
        process.wait_for_output(READY)
        process.children()
        yield process
    finally:
        process.kill_all()


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., UpProcess]]:
    """Starts ``capdisc up`` in ``tmp_path`` (with ``examples/registry`` copied there) and
    waits for its ready line; everything started is killed at the end, pass or fail."""
    started: list[UpProcess] = []

    def start(*, ignore_sigint: bool = False, env: dict[str, str] | None = None) -> UpProcess:
        registry = tmp_path / "examples" / "registry"
        if not registry.exists():
            shutil.copytree(EXAMPLES, registry)
        up = UpProcess(tmp_path, ignore_sigint=ignore_sigint, env=env)
        started.append(up)
        up.wait_for_output(READY)
        up.children()
        return up

    try:
        yield start
    finally:
        for up in started:
            up.kill_all()
