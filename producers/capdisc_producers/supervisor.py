"""Supervision of the processes ``capdisc up`` runs: restart with backoff, reap, record, stop.

A child that exits is reaped at once (no zombie), reported (exit code or signal, and the tail of
its log file), and started again after an exponential backoff: 0.5 s, doubling up to 30 s, back
to 0.5 s once the child has stayed up for 30 s. A start that fails is retried the same way.

Each child runs in a session of its own (``start_new_session``), so the terminal's Ctrl-C reaches
``up`` alone, which then stops the children in order (workers first, Redis last) instead of every
process dying at once and the workers logging a Redis that vanished under them. Signals go to
the child's whole process group, so anything a child started goes with it.

No child outlives ``up``. A clean stop sends SIGTERM, then SIGKILL after a grace period. If
``up`` dies without cleaning up (SIGKILL, a crash, the OOM killer), Linux sends every child its
parent-death signal, set with ``prctl(PR_SET_PDEATHSIG)`` between fork and exec
(:func:`die_with_parent`). The kernel sends it, so it holds when ``up`` runs no code at all, and
it is kept across exec. Two caveats, both handled: the kernel ties the signal to the *thread*
that forked the child, so children are only ever started from the main thread of ``up`` (the
supervision loop runs there, the watcher in a thread of its own); and a parent that dies between
fork and prctl would be missed, so the child compares its parent pid right after prctl and exits
if it changed. The alternative, a parent-pid watch inside every child, would need code in each
of them (redis-server included) and polling. Where prctl does not exist (not Linux), a clean
stop still stops every child, but a killed ``up`` leaves them running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from capdisc.errors import CapdiscError

log = structlog.get_logger("capdisc.supervisor")

#: First restart delay, its cap, and how long a child must stay up for the delay to reset.
BACKOFF_FIRST_S = 0.5
BACKOFF_CAP_S = 30.0
STABLE_AFTER_S = 30.0
#: How long a child has between SIGTERM and SIGKILL when ``up`` stops.
STOP_GRACE_S = 15.0
#: Lines and characters of a child's log quoted when it exits.
TAIL_LINES = 12
TAIL_CHARS = 2000

_PR_SET_PDEATHSIG = 1

Say = Callable[[str], None]
Start = Callable[[], "subprocess.Popen[bytes]"]


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


#: Resolved once, in the parent: the child between fork and exec only calls it.
_PRCTL = _load_prctl()


def die_with_parent(
    signum: int, then: Callable[[], None] | None = None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``signum`` when the thread that started it
    dies (``None`` where the platform cannot). Call it, and start the child, from the thread
    that lives as long as the parent: the main thread. ``then`` runs after it, in the child."""
    if _PRCTL is None:
        return then
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        if then is not None:
            then()

    return preexec


def child_options(death_signal: int) -> dict[str, Any]:
    """Popen options of a supervised child: a session of its own, ``death_signal`` when ``up``
    dies."""
    return {"start_new_session": True, "preexec_fn": die_with_parent(death_signal)}


def exit_reason(returncode: int) -> str:
    """``exit code 1``, ``killed by SIGKILL``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def log_tail(path: Path, lines: int = TAIL_LINES, max_chars: int = TAIL_CHARS) -> str:
    """The last ``lines`` lines of ``path`` (at most ``max_chars``), or a note that it is empty."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_chars * 2))
            text = handle.read().decode(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"
    tail = "\n".join(text.splitlines()[-lines:])[-max_chars:]
    return tail or f"({path} is empty)"


@dataclass
class Backoff:
    """Exponential delays: ``first_s``, doubling, at most ``cap_s``."""

    first_s: float = BACKOFF_FIRST_S
    cap_s: float = BACKOFF_CAP_S
    delay_s: float = BACKOFF_FIRST_S

    def __post_init__(self) -> None:
        self.delay_s = self.first_s

    def next(self) -> float:
        delay, self.delay_s = self.delay_s, min(self.cap_s, self.delay_s * 2)
        return delay

    def reset(self) -> None:
        self.delay_s = self.first_s


@dataclass
class Child:
    """One supervised process: how to start it, where it logs, what happened to it."""

    name: str
    start: Start
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    started_ms: int = 0
    restarts: int = 0
    last_exit: str | None = None
    last_restart_ms: int | None = None
    restart_at: float | None = None
    backoff: Backoff = field(default_factory=Backoff)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def launch(self) -> None:
        self.process = self.start()
        self.started_at = time.monotonic()
        self.started_ms = int(time.time() * 1000)
        self.restart_at = None

    def describe(self) -> dict[str, Any]:
        """What ``capdisc status`` shows of this child."""
        return {
            "name": self.name,
            "pid": self.pid if self.alive else None,
            "alive": self.alive,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "last_restart_ms": self.last_restart_ms,
            "started_ms": self.started_ms,
            "log": str(self.log_path),
        }


class Supervisor:
    """Keeps its children running until :meth:`stop`; call :meth:`tick` often, from the main
    thread. ``on_exit(child, pid)`` hears of every exit (after it is reported),
    ``on_change()`` of every exit and restart."""

    def __init__(
        self,
        say: Say,
        *,
        on_exit: Callable[[Child, int], None] | None = None,
        on_change: Callable[[], None] | None = None,
        stable_after_s: float = STABLE_AFTER_S,
        log_max_bytes: int | None = None,
    ) -> None:
        self.say = say
        #: A child's log past this size is rotated (:func:`rotate_log`); None: never.
        self.log_max_bytes = log_max_bytes
        self.children: dict[str, Child] = {}
        self.on_exit = on_exit
        self.on_change = on_change
        self.stable_after_s = stable_after_s
        self.stopping = False

    def add(self, name: str, start: Start, log_path: Path) -> Child:
        """Start a child now and supervise it from then on."""
        child = Child(name, start, log_path)
        self.children[name] = child
        child.launch()
        log.info("child_started", child=name, pid=child.pid)
        return child

    def pids(self) -> dict[str, int]:
        return {name: c.pid for name, c in self.children.items() if c.alive and c.pid}

    def exited(self) -> Child | None:
        """The first child that exited (reaped), if any: startup uses it to fail fast."""
        return next(
            (
                c
                for c in self.children.values()
                if c.process is not None and c.process.poll() is not None
            ),
            None,
        )

    def tick(self) -> None:
        """Reap and report children that exited, restart those whose delay passed, rotate
        the logs that outgrew ``log_max_bytes``."""
        now = time.monotonic()
        for child in self.children.values():
            if self.stopping:
                return
            if self.log_max_bytes is not None:
                rotate_log(child.log_path, self.log_max_bytes)
            if child.alive:
                self._check(child, now)
            elif child.restart_at is not None and now >= child.restart_at:
                self._restart(child, now)

    def _check(self, child: Child, now: float) -> None:
        assert child.process is not None
        if child.process.poll() is None:
            if now - child.started_at >= self.stable_after_s:
                child.backoff.reset()
            return
        pid, reason = child.process.pid, exit_reason(child.process.returncode)
        child.last_exit = reason
        delay = child.backoff.next()
        child.restart_at = now + delay
        log.info(
            "child_exited",
            child=child.name,
            pid=pid,
            reason=reason,
            restart_in_s=delay,
            restarts=child.restarts,
        )
        self.say(
            f"{child.name} (pid {pid}) exited: {reason}; restarting it in {delay:g} s. "
            f"Last lines of {child.log_path}:\n{_indent(log_tail(child.log_path))}"
        )
        if self.on_exit is not None:
            self.on_exit(child, pid)
        self._changed()

    def _restart(self, child: Child, now: float) -> None:
        try:
            child.launch()
        except (OSError, CapdiscError) as exc:
            delay = child.backoff.next()
            child.restart_at = now + delay
            log.info("child_restart_failed", child=child.name, error=str(exc), retry_in_s=delay)
            self.say(f"{child.name} did not start again ({exc}); next try in {delay:g} s")
            return
        child.restarts += 1
        child.last_restart_ms = child.started_ms
        log.info("child_restarted", child=child.name, pid=child.pid, restarts=child.restarts)
        self.say(f"{child.name} restarted (pid {child.pid}, restart {child.restarts})")
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def stop(
        self,
        names: Iterable[str],
        grace_s: float = STOP_GRACE_S,
        force: Callable[[], bool] = lambda: False,
    ) -> None:
        """Stop these children: SIGTERM, then SIGKILL after ``grace_s`` (or as soon as
        ``force()`` is true); each is reaped before this returns."""
        self.stopping = True
        stopping = [self.children[n] for n in names if n in self.children]
        for child in stopping:
            child.restart_at = None
            _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(c.process is not None and c.process.poll() is None for c in stopping):
            if time.monotonic() >= deadline or force():
                break
            time.sleep(0.05)
        for child in stopping:
            if child.process is not None and child.process.poll() is None:
                log.warning("child_killed", child=child.name, pid=child.pid, grace_s=grace_s)
                _signal(child, signal.SIGKILL)
                child.process.wait()


def rotated_log(path: Path) -> Path:
    """Where :func:`rotate_log` keeps the previous part of the log at ``path``."""
    return path.with_name(f"{path.name}.1")


def rotate_log(path: Path, max_bytes: int) -> bool:
    """Once the log at ``path`` outgrows ``max_bytes``, copy it over :func:`rotated_log` and
    empty it in place; whether it did. Children write their logs in append mode, so a child's
    next line starts the emptied file (lines written between the copy and the emptying are
    lost); a log and its previous part take about twice ``max_bytes``. When the copy fails
    (a full disk) the log is emptied all the same: bounding the disk comes first."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= max_bytes:
        return False
    try:
        shutil.copyfile(path, rotated_log(path))
    except OSError as exc:
        log.warning("log_copy_failed", path=str(path), error=str(exc), bytes_dropped=size)
    try:
        os.truncate(path, 0)
    except OSError as exc:
        log.warning("log_rotate_failed", path=str(path), error=str(exc))
        return False
    log.info("log_rotated", path=str(path), bytes=size, kept=str(rotated_log(path)))
    return True


def _signal(child: Child, signum: int) -> None:
    """Signal the child's process group (its session), or the child alone if that fails."""
    process = child.process
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())
