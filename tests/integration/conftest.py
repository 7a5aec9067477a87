"""Integration fixtures: a real Redis server and real worker processes, started by the suite.

One Redis server and one indexing worker (Celery, solo pool) and one discovery worker per test
session, all with the deterministic hashing embedder. Tests isolate themselves by tenant, so no
test ever flushes state another depends on. Readiness is awaited on events (a publish batch's
acks, a discovery answer), never by sleeping.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc.client import Client
from capdisc.localredis import LocalRedis, start_redis
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import DISCOVERY_ARGV, indexing_argv
from capdisc_producers.supervisor import die_with_parent
from capdisc_producers.sync import SyncReport, sync_directory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "registry"
MAX_BYTES = 64 * 1024

pytestmark = pytest.mark.integration


@dataclass
class Stack:
    """What integration tests talk to."""

    redis_server: LocalRedis
    env: dict[str, str]
    log_dir: Path
    processes: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return self.redis_server.url

    def connection(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def spawn(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        """Start a worker; the kernel kills it if the test process dies without stopping it."""
        with (self.log_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv,
                env={**self.env, **env},
                stdout=log,
                stderr=log,
                cwd=ROOT,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        self.processes.append(process)
        return process

    def close(self) -> None:
        """Stop every process started here (SIGTERM, SIGKILL after 15 s; each reaped), then
        Redis."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.redis_server.stop()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM ``process``, SIGKILL it if it is still running after ``timeout_s``; reaped."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail saying ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(every_s)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env.update(
        CAPDISC_REDIS_URL=url,
        CAPDISC_EMBEDDER="hashing",
        CAPDISC_LOG_LEVEL="INFO",
        CAPDISC_HEARTBEAT_INTERVAL_S="0.5",
        # tests run `capdisc reconcile` when they want one: a periodic run would race them
        CAPDISC_RECONCILE_INTERVAL_S="0",
        CAPDISC_SETTINGS_FILE=str(ROOT / "tests" / "fixtures" / "stack_settings.yaml"),
    )
    return env


INDEXING_ARGV = indexing_argv()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("stack")
    server = start_redis(base / "redis", durable=False, preexec_fn=die_with_parent(signal.SIGTERM))
    log_dir = base / "logs"
    log_dir.mkdir()
    running = Stack(server, worker_env(server.url), log_dir, [])
    try:
        running.spawn("indexing", [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"])
        running.spawn("discovery", DISCOVERY_ARGV)
        _await_ready(running)
        yield running
    finally:
        running.close()


def _await_ready(running: Stack) -> None:
    """Publish one capability and discover it: proves both workers are up."""
    source = running.log_dir / "warmup"
    (source / "ping").mkdir(parents=True)
    (source / "ping" / "CAPABILITY.yaml").write_text(
        "name: ping\nkind: tool\ndescription: Answers ping with pong.\n"
    )
    report = publish(running.url, source, "warmup", wait_s=90)
    assert report.complete, f"indexing worker did not start; see {running.log_dir}"
    Client(running.connection(), tenant="warmup", timeout_s=90).discover(
        "ping", min_version=report.index_version
    )


def publish(url: str, source: Path, tenant: str, wait_s: float = 30) -> SyncReport:
    """Publish a directory and wait until every event it sent is applied."""
    publisher = Publisher(url)
    try:
        return sync_directory(
            redis.Redis.from_url(url),
            publisher,
            source,
            tenant=tenant,
            max_bytes=MAX_BYTES,
            wait_s=wait_s,
        )
    finally:
        publisher.close()


@pytest.fixture
def connection(stack: Stack) -> Iterator[redis.Redis]:
    client = stack.connection()
    yield client
    client.close()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(connection: redis.Redis, tenant: str) -> Client:
    return Client(connection, tenant=tenant, timeout_s=20)


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """A private copy of the example registry that a test may edit."""
    target = tmp_path / "registry"
    shutil.copytree(EXAMPLES, target)
    return target
