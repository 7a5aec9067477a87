"""A stack of a test's own, beside the suite's shared one: its own Redis (which the test may stop,
wipe and start again on the same port) and its own worker processes, with the same environment
as the shared stack's. Everything it starts is stopped when the ``with`` block ends, pass or
fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc import keys
from capdisc.localredis import LocalRedis, free_port, start_redis
from capdisc.status import live_workers
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport
from capdisc_producers.watcher import watch_directory

from .conftest import (
    DISCOVERY_ARGV,
    EXAMPLES,
    INDEXING_ARGV,
    MAX_BYTES,
    ROOT,
    publish,
    stop_process,
    worker_env,
)
from .conftest import wait_for as wait_for  # re-exported: the tests of private stacks use it


class PrivateStack:
    """A Redis and the workers a test started for itself."""

    def __init__(self, base: Path, durable: bool) -> None:
        self.base = base
        self.redis_dir = base / "redis"
        self.log_dir = base / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.durable = durable
        self.port = free_port()
        self.server: LocalRedis = start_redis(self.redis_dir, port=self.port, durable=durable)
        self.env = worker_env(self.server.url)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return self.server.url

    def connection(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=2.0)

    def spawn(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv, env={**self.env, **env}, stdout=log, stderr=log, cwd=ROOT
            )
        self.processes[name] = process
        return process

    def spawn_indexing(self, name: str = "indexing") -> subprocess.Popen[bytes]:
        return self.spawn(name, [*INDEXING_ARGV, "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h"])

    def spawn_discovery(self, name: str = "discovery", **env: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, DISCOVERY_ARGV, **env)

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name)
        stop_process(process, 15.0)

    def stop_redis(self) -> None:
        self.server.stop()

    def start_redis(self, *, lose_data: bool) -> None:
        """Start Redis again on the same port; with ``lose_data``, without its files."""
        if lose_data:
            shutil.rmtree(self.redis_dir)
        self.server = start_redis(self.redis_dir, port=self.port, durable=self.durable)

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The last ``lines`` lines of process ``name``'s log, for a failure message."""
        text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of process ``name`` whose event is ``event``."""
        found = []
        for line in (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
        return found

    def close(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            stop_process(process, 15.0)
        self.server.stop()

    def __enter__(self) -> PrivateStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_registry(target: Path, keep: Callable[[Path], bool] = lambda _p: True) -> Path:
    """A copy of the example registry (only the capability directories ``keep`` accepts)."""
    for manifest in EXAMPLES.rglob("CAPABILITY.yaml"):
        if keep(manifest.parent):
            shutil.copytree(manifest.parent, target / manifest.parent.relative_to(EXAMPLES))
    return target


def publish_and_serve(
    stack: PrivateStack,
    registry: Path,
    tenant: str,
    discovery_workers: int = 1,
    timeout_s: float = 90,
) -> int:
    """Publish ``registry`` and wait until ``discovery_workers`` workers serve its version (their
    heartbeats say so); the version."""
    report = publish(stack.url, registry, tenant, wait_s=timeout_s)
    assert report.complete, f"indexing worker did not apply the registry; see {stack.log_dir}"
    deadline = time.monotonic() + timeout_s
    connection = stack.connection()
    try:
        while time.monotonic() < deadline:
            serving = [
                w
                for w in live_workers(connection, 5.0)
                if w["kind"] == "discovery"
                and w["versions"].get(tenant, -1) >= report.index_version
            ]
            if len(serving) >= discovery_workers:
                return report.index_version
            time.sleep(0.1)
    finally:
        connection.close()
    raise AssertionError(
        f"{discovery_workers} discovery worker(s) did not serve {tenant} "
        f"within {timeout_s} s; see {stack.log_dir}"
    )


def dead_letters_by_entry(connection: redis.Redis) -> dict[str, dict[str, str]]:
    """The discovery requests in the dead-letter stream, by the request entry id they were."""
    letters = {}
    for _letter_id, fields in connection.xrange(keys.DEADLETTERS):
        decoded = {k.decode(): v.decode() for k, v in fields.items()}
        if decoded.get("source") == keys.DISCOVERY_REQUESTS:
            letters[decoded["entry_id"]] = decoded
    return letters


def default_env(url: str) -> dict[str, str]:
    """Workers' environment with every capdisc setting at its default but the deterministic
    embedder (and auth, which the tests of faults leave out): no test speedups."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env.update(CAPDISC_REDIS_URL=url, CAPDISC_EMBEDDER="hashing", CAPDISC_AUTH="off")
    return env


@pytest.fixture
def private_on_defaults(tmp_path: Path) -> Iterator[PrivateStack]:
    """A durable Redis of the test's own, whose workers run on the default settings."""
    stack = PrivateStack(tmp_path, durable=True)
    stack.env = default_env(stack.url)
    try:
        yield stack
    finally:
        stack.close()


def write_catalog(path: Path, count: int, prefix: str) -> Path:
    """A tools.jsonl of ``count`` generated tools, ids ``{prefix}-00000`` on."""
    with path.open("w") as out:
        for i in range(count):
            out.write(
                json.dumps(
                    {
                        "id": f"{prefix}-{i:05d}",
                        "name": f"{prefix}_tool_{i:05d}",
                        "description": f"Probe {i} of {prefix}: answers probe {i}.",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    }
                )
                + "\n"
            )
    return path


@contextmanager
def watcher_running(
    url: str,
    root: Path,
    tenant: str,
    on_sync: Callable[[SyncReport], None] | None = None,
) -> Iterator[threading.Thread]:
    """A watcher thread on ``root`` publishing to the Redis at ``url`` as ``tenant``; stopped,
    joined and its publisher closed when the block ends."""
    stop = threading.Event()
    publisher = Publisher(url)
    thread = threading.Thread(
        target=watch_directory,
        daemon=True,
        kwargs=dict(
            client=redis.Redis.from_url(url, socket_connect_timeout=2.0),
            publisher=publisher,
            root=root,
            tenant=tenant,
            max_bytes=MAX_BYTES,
            debounce_ms=100,
            stop=stop,
            on_sync=on_sync,
        ),
    )
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=15)
        publisher.close()
