"""Redis on a unix socket: the indexing worker and the producers reach it as redis-py does."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.localredis import find_redis_server
from capdisc_producers.supervisor import die_with_parent

from .conftest import INDEXING_ARGV, Stack, publish, stop_process, wait_for, worker_env


@pytest.fixture
def socket_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis listening on a unix socket only, with a password; its URL (database 2)."""
    sock = tmp_path / "r.sock"
    options = ["--appendonly", "no", "--requirepass", "s3cret", "--dir", str(tmp_path)]
    server = subprocess.Popen(
        [str(find_redis_server()), "--port", "0", "--unixsocket", str(sock), *options],
        stdout=subprocess.DEVNULL,
        preexec_fn=die_with_parent(signal.SIGTERM),
    )
    url = f"unix://:s3cret@{sock}?db=2"
    try:
        wait_for(lambda: sock.exists() and redis.Redis.from_url(url).ping(), 10, "redis start")
        yield url
    finally:
        stop_process(server)


def test_an_indexing_worker_applies_events_through_a_unix_socket(
    socket_redis: str, tmp_path: Path, stack: Stack
) -> None:
    log = tmp_path / "logs"
    log.mkdir()
    worker = Stack(stack.redis_server, worker_env(socket_redis), log, [])
    worker.spawn("indexing", [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"])
    try:
        source = tmp_path / "reg" / "ping"
        source.mkdir(parents=True)
        (source / "CAPABILITY.yaml").write_text("name: ping\nkind: tool\ndescription: Pong.\n")

        report = publish(socket_redis, source.parent, "sock", wait_s=60)

        assert report.complete, (log / "indexing.log").read_text()[-2000:]
        assert redis.Redis.from_url(socket_redis).hexists(keys.caps("sock"), "tool:ping")
    finally:
        for process in worker.processes:
            stop_process(process)
