"""The embedded default stack (``capdisc up``): Redis, one indexing worker, one discovery worker
and the watcher, on one machine with nothing installed but Python.

The stack writes ``.capdisc/stack.json`` so that commands run from the project directory find it
with no flags. ``CAPDISC_REDIS_URL`` overrides both (it points ``up`` at an existing Redis and
the other commands at any stack). Ctrl-C stops every child and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from capdisc.client import Client
from capdisc.errors import CapdiscError, StackNotFoundError
from capdisc.localredis import LocalRedis, start_redis
from capdisc.settings import Settings
from capdisc.status import live_workers
from capdisc.store import tenant_version
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, sync_directory
from capdisc_producers.watcher import watch_directory

STATE_DIR = ".capdisc"
STACK_FILE = "stack.json"
REDIS_ENV = "CAPDISC_REDIS_URL"
WORKER_START_TIMEOUT_S = 120.0


def find_stack(start: Path) -> dict[str, Any] | None:
    """The stack file of a running stack in ``start`` or a parent directory."""
    for directory in (start, *start.parents):
        path = directory / STATE_DIR / STACK_FILE
        if path.is_file():
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            return data
    return None


def resolve_redis_url(explicit: str | None, environ: Mapping[str, str], cwd: Path) -> str:
    """``--redis-url``, else ``CAPDISC_REDIS_URL``, else the running stack's, else an error."""
    if explicit:
        return explicit
    if environ.get(REDIS_ENV):
        return environ[REDIS_ENV]
    stack = find_stack(cwd)
    if stack and stack.get("redis_url"):
        return str(stack["redis_url"])
    raise StackNotFoundError(f"no running capdisc stack found from {cwd} (no {STATE_DIR}/"
                             f"{STACK_FILE}); start one with `make up`, or set {REDIS_ENV}")


@dataclass
class Stack:
    """The processes ``capdisc up`` runs, and how to stop them."""

    project: Path
    settings: Settings
    redis_server: LocalRedis | None = None
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.project / STATE_DIR

    def start(self, environ: Mapping[str, str]) -> str:
        """Start Redis (unless one is given) and the two workers; return the Redis URL."""
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        url = environ.get(REDIS_ENV) or self._start_redis()
        env = {**environ, REDIS_ENV: url}
        self._write_stack_file(url)
        self.spawn("indexing", [sys.executable, "-m", "celery", "-A",
                                "capdisc_workers.celery_app", "worker", "-Q", "indexing", "-P",
                                "solo", "--without-gossip", "--without-mingle",
                                "--without-heartbeat", "-n", f"indexing-{os.getpid()}@%h",
                                "--loglevel", self.settings.log_level], env)
        self.spawn("discovery", [sys.executable, "-m", "capdisc_workers.discovery"], env)
        return url

    def _start_redis(self) -> str:
        self.redis_server = start_redis(self.state_dir / "redis")
        return self.redis_server.url

    def _write_stack_file(self, url: str) -> None:
        data = {"redis_url": url, "pid": os.getpid(), "started_at": time.time()}
        (self.state_dir / STACK_FILE).write_text(json.dumps(data, indent=2) + "\n")

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        log = (self.state_dir / "logs" / f"{name}.log").open("ab")
        self.children.append(subprocess.Popen(argv, env=dict(env), stdout=log, stderr=log,
                                              cwd=self.project))

    def wait_for_workers(self, client: redis.Redis, kinds: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for child in self.children:
                if child.poll() is not None:
                    raise CapdiscError(f"a worker exited at start (code {child.returncode}); "
                                       f"see {self.state_dir / 'logs'}")
            if kinds <= {w["kind"] for w in live_workers(client)}:
                return
            time.sleep(0.1)
        raise CapdiscError(f"workers did not report ready within {timeout_s:.0f} s; see "
                           f"{self.state_dir / 'logs'}")

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self.redis_server is not None:
            self.redis_server.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / STACK_FILE).unlink()


@contextlib.contextmanager
def running_stack(project: Path, settings: Settings, environ: Mapping[str, str]
                  ) -> Iterator[tuple[Stack, str]]:
    stack = Stack(project=project, settings=settings)
    try:
        url = stack.start(environ)
        yield stack, url
    finally:
        stack.stop()


def run_up(project: Path, registry: Path, settings: Settings, environ: Mapping[str, str],
           say: Callable[[str], None]) -> None:
    """Start everything, index ``registry``, print the ready line, then watch until Ctrl-C."""
    started = time.monotonic()
    with running_stack(project, settings, environ) as (stack, url):
        settings = settings.with_changes(redis_url=url)
        client = redis.Redis.from_url(url)
        say(f"redis at {url}; starting workers (logs in {stack.state_dir / 'logs'})")
        stack.wait_for_workers(client, {"indexing", "discovery"}, WORKER_START_TIMEOUT_S)
        publisher = Publisher(url)
        report = sync_directory(client, publisher, registry, tenant=settings.tenant,
                                max_bytes=settings.manifest_max_bytes, wait_s=120.0)
        _report_errors(report, say)
        version = report.index_version or tenant_version(client, settings.tenant)
        with Client(client, tenant=settings.tenant, timeout_s=30.0) as discovery:
            answer = discovery.discover("ready check", min_version=version)
        say(f"capdisc is ready in {time.monotonic() - started:.1f} s: "
            f"{answer.raw['total_indexed']} capabilities at index version "
            f"{answer.index_version}, watching {registry}. Try: {_cli_name()} discover "
            "\"post a message to the team's slack channel\"  (Ctrl-C stops everything)")
        stop = threading.Event()
        try:
            watch_directory(client, publisher, registry, tenant=settings.tenant,
                            max_bytes=settings.manifest_max_bytes,
                            debounce_ms=settings.watch_debounce_ms, stop=stop,
                            on_sync=lambda r: _report_sync(r, say))
        finally:
            stop.set()
            say("stopping capdisc...")


def _report_sync(report: SyncReport, say: Callable[[str], None]) -> None:
    if report.sent or report.plan.errors:
        say(report.summary())
        _report_errors(report, say)


def _report_errors(report: SyncReport, say: Callable[[str], None]) -> None:
    for error in report.plan.errors.values():
        say(f"rejected: {error}")


def _cli_name() -> str:
    argv0 = Path(sys.argv[0])
    try:
        return str(argv0.resolve().relative_to(Path.cwd()))
    except ValueError:
        return "capdisc"
