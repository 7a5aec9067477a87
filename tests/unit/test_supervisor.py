"""The supervisor of ``capdisc up`` on real short-lived processes (no Redis): backoff, exit
reasons, log tails, restart and reaping, stop with SIGKILL after the grace, death with the
parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capdisc_producers.supervisor import (
    Backoff,
    Supervisor,
    child_options,
    exit_reason,
    log_tail,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)",
]


def until(condition: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def gone(pid: int) -> bool:
    """Reaped, or at least not running (a zombie whose parent is not us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[Supervisor, list[str]]]:
    said: list[str] = []
    supervised = Supervisor(said.append, stable_after_s=60)
    try:
        yield supervised, said
    finally:
        supervised.stop(list(supervised.children), grace_s=2)


def starter(argv: list[str], log: Path) -> Callable[[], subprocess.Popen[bytes]]:
    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=out, **child_options(signal.SIGKILL))

    return start


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(first_s=0.5, cap_s=3.0)

    delays = [backoff.next() for _ in range(5)]
    backoff.reset()

    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.next() == 0.5


def test_exit_reasons_name_the_code_or_the_signal() -> None:
    assert exit_reason(0) == "exit code 0"
    assert exit_reason(3) == "exit code 3"
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL"


def test_log_tail_quotes_the_last_lines_or_says_why_it_cannot(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)))

    assert log_tail(log, lines=3) == "line 97\nline 98\nline 99"
    assert "cannot read" in log_tail(tmp_path / "missing.log")


def test_a_child_that_dies_is_reaped_reported_and_restarted_after_its_backoff(
    supervisor: tuple[Supervisor, list[str]], tmp_path: Path
) -> None:
    supervised, said = supervisor
    log = tmp_path / "sleeper.log"
    log.write_text("the sleeper's last words\n")
    child = supervised.add("sleeper", starter(SLEEPER, log), log)
    old = child.pid
    assert old is not None

    os.kill(old, signal.SIGKILL)
    until(lambda: supervised.tick() or child.restarts == 1)

    assert child.pid != old and child.alive
    assert not Path(f"/proc/{old}").exists()  # reaped: no zombie left
    assert child.last_exit == "killed by SIGKILL"
    assert child.backoff.delay_s == 1.0  # the next restart waits twice as long
    assert f"sleeper (pid {old}) exited: killed by SIGKILL" in said[0]
    assert "the sleeper's last words" in said[0]
    assert said[1] == f"sleeper restarted (pid {child.pid}, restart 1)"


def test_stop_kills_a_child_that_ignores_sigterm_once_the_grace_is_over(
    supervisor: tuple[Supervisor, list[str]], tmp_path: Path
) -> None:
    supervised, _ = supervisor
    log = tmp_path / "stubborn.log"
    child = supervised.add("stubborn", starter(STUBBORN, log), log)
    until(lambda: "ready" in log.read_text())

    started = time.monotonic()
    supervised.stop(["stubborn"], grace_s=0.5)

    assert child.process is not None and child.process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_a_child_dies_with_its_parent_even_when_the_parent_is_killed(tmp_path: Path) -> None:
    parent_code = (
        "import signal, subprocess, sys, time\n"
        "from capdisc_producers.supervisor import child_options\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(120)'], **child_options(signal.SIGKILL))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not gone(child_pid)

        parent.kill()
        parent.wait()

        until(lambda: gone(child_pid))
    finally:
        parent.kill()
        parent.wait()
        if child_pid and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


CHATTY = [
    sys.executable,
    "-c",
    "import sys, time\n"
    "for i in range(100_000):\n"
    "    print(f'line {i:06d} ' + 'x' * 200, flush=True)\n"
    "    time.sleep(0.0005)",
]


def test_a_childs_log_is_rotated_once_it_outgrows_its_bound_and_the_child_writes_on(
    tmp_path: Path,
) -> None:
    log = tmp_path / "chatty.log"
    supervised = Supervisor(lambda _: None, log_max_bytes=16_384)
    try:
        supervised.add("chatty", starter(CHATTY, log), log)
        deadline = time.monotonic() + 2
        sizes = []
        while time.monotonic() < deadline:
            supervised.tick()
            sizes.append(log.stat().st_size)
            time.sleep(0.05)
        first = log.read_bytes().split(b"\n", 1)[0]
    finally:
        supervised.stop(list(supervised.children), grace_s=2)

    rotated = tmp_path / "chatty.log.1"
    assert rotated.exists()
    assert max(sizes[-20:]) < 16_384 * 4  # about 0.8 MB written in 2 s
    assert b"\0" not in first and first.startswith(b"line ")  # appends, no hole before them
    assert rotated.read_bytes().startswith(b"line ")
