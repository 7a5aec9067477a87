"""The Redis ACL users of infra/redis-users.acl are enough, and no more: real workers and the CLI
run every flow as their own users (publish, delete, reindex, a full reindex, reconcile, import,
dead letters, discovery and every session operation, status) with nothing denied; clients and
producers cannot read requests in flight, read or write capabilities or sessions directly, or
run administrative commands; the default user is off."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.identity import auth
from capdisc.localredis import find_redis_server, free_port
from capdisc_producers.supervisor import die_with_parent

from .conftest import DISCOVERY_ARGV, EXAMPLES, INDEXING_ARGV, ROOT, stop_process


def _server_major() -> int:
    out = subprocess.run(
        [str(find_redis_server()), "--version"], capture_output=True, text=True, check=True
    ).stdout  # "Redis server v=7.0.15 sha=..."
    return int(out.split("v=")[1].split(".")[0])


pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        _server_major() < 7,
        reason="the ACL file uses Redis 7 key selectors "
        "(%R~, %W~); this machine's redis-server is older",
    ),
]

ACL_FILE = ROOT / "infra" / "redis-users.acl"
ROLES = ("admin", "indexing", "discovery", "producer", "client", "monitor")
CLI = [sys.executable, "-m", "capdisc_producers.cli"]


class AclStack:
    """A Redis with the ACL users of the infra file (test passwords) and workers as their
    users; every process it starts dies with the test, pass or fail."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        text = ACL_FILE.read_text()
        for role in ROLES:
            text = text.replace(f">CHANGE-ME-{role}", f">test-{role}")
        (base / "users.acl").write_text(text)
        self.keys_file = base / "keys.json"
        self.keyring = auth.Keyring([auth.new_key(time.time())])
        auth.save_keyring(self.keys_file, self.keyring)
        self._start(
            [
                str(find_redis_server()),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(base),
                "--save",
                "",
                "--appendonly",
                "no",
                "--aclfile",
                str(base / "users.acl"),
                "--logfile",
                str(base / "redis.log"),
            ],
            "redis",
            {},
        )
        self.admin = self.connection("admin")
        deadline = time.monotonic() + 10
        while True:
            try:
                self.admin.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def url(self, role: str) -> str:
        return f"redis://capdisc-{role}:test-{role}@127.0.0.1:{self.port}/0"

    def connection(self, role: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(role), socket_connect_timeout=2)

    def env(self, role: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
        env.update(
            CAPDISC_REDIS_URL=self.url(role),
            CAPDISC_EMBEDDER="hashing",
            CAPDISC_AUTH="on",
            CAPDISC_AUTH_KEYS_FILE=str(self.keys_file),
            CAPDISC_HEARTBEAT_INTERVAL_S="0.5",
            CAPDISC_RECONCILE_INTERVAL_S="0",
        )
        return env

    def token(self, grants: list[str]) -> str:
        return auth.issue(self.keyring, tenant="acme", grants=grants, ttl_s=600, now=time.time())

    def _start(self, argv: list[str], name: str, env: dict[str, str]) -> None:
        with (self.base / f"{name}.log").open("ab") as out:
            self.processes.append(
                subprocess.Popen(
                    argv,
                    env=env or None,
                    stdout=out,
                    stderr=out,
                    cwd=ROOT,
                    preexec_fn=die_with_parent(signal.SIGKILL),
                )
            )

    def spawn_workers(self) -> None:
        self._start([*INDEXING_ARGV, "-n", "acl-indexing@%h"], "indexing", self.env("indexing"))
        self._start(DISCOVERY_ARGV, "discovery", self.env("discovery"))

    def cli(self, *args: str, role: str = "producer") -> subprocess.CompletedProcess[str]:
        env = {**self.env(role), "CAPDISC_TOKEN": self.token(["write"])}
        return subprocess.run(
            [*CLI, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    def denials(self) -> list[dict[str, Any]]:
        log: list[dict[str, Any]] = self.admin.acl_log(count=500)
        return log

    def close(self) -> None:
        for process in reversed(self.processes):
            stop_process(process)


@pytest.fixture
def acl_stack(tmp_path: Path) -> Iterator[AclStack]:
    stack = AclStack(tmp_path)
    try:
        yield stack
    finally:
        stack.close()


def test_each_role_runs_every_flow_with_only_its_own_permissions(
    acl_stack: AclStack, tmp_path: Path
) -> None:
    acl_stack.spawn_workers()
    registry = tmp_path / "registry"
    shutil.copytree(EXAMPLES / "finance", registry / "finance")
    catalog = tmp_path / "tools.jsonl"
    catalog.write_text(
        json.dumps(
            {
                "id": "weather",
                "name": "weather",
                "category": "x",
                "description": "Gets the weather for a city.",
                "has_side_effects": False,
                "parameters": {"type": "object"},
            }
        )
        + "\n"
    )

    runs = [
        acl_stack.cli("publish", str(registry), "--tenant", "acme", "--timeout", "90"),
        acl_stack.cli("delete", "tool:stripe-refund", "--tenant", "acme"),
        acl_stack.cli("reindex", "tool:stripe-create-invoice", "--tenant", "acme"),
        acl_stack.cli("reindex", "--all", "--tenant", "acme", "--timeout", "90"),
        acl_stack.cli("reconcile", "--timeout", "60"),
        acl_stack.cli("import", "jsonl", str(catalog), "--tenant", "acme"),
        acl_stack.cli("dlq", "list"),
        acl_stack.cli("dlq", "replay", "--all"),
        acl_stack.cli("status", role="monitor"),
        acl_stack.cli("dlq", "list", role="monitor"),
    ]
    client = Client.from_url(
        acl_stack.url("client"), timeout_s=20, token=acl_stack.token(["discover", "session"])
    )
    found = client.discover("create an invoice", session="s1", tool_format="mcp")
    called = client.record_tool_call("s1", found.ids[0], {"amount": 1})
    exported = client.export_session("s1")
    imported = client.import_session("s2", exported)
    shown = client.working_set("s1")
    watched = [e["type"] for e in islice(client.watch_session("s1"), 2)]
    emptied = acl_stack.cli("delete", "--all", "--tenant", "acme")

    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    assert found.ids[0] == "tool:stripe-create-invoice"
    assert called["loop_detected"] is False
    assert len(imported["bound"]) == len(shown["bound"]) == len(exported["bound"])
    assert watched == ["bound", "bound"]
    assert emptied.returncode == 0, emptied.stderr
    assert acl_stack.denials() == [], json.dumps(acl_stack.denials(), default=str)


@pytest.mark.parametrize(
    ("role", "what"),
    [
        ("client", lambda r: r.xrange(keys.DISCOVERY_REQUESTS)),
        ("client", lambda r: r.hgetall(keys.caps("acme"))),
        ("client", lambda r: r.hset(keys.caps("acme"), "tool:x", "{}")),
        ("client", lambda r: r.hgetall(keys.session("acme", "s1"))),
        ("client", lambda r: r.lpush(keys.INDEXING_QUEUE, "{}")),
        ("client", lambda r: r.get(keys.SESSIONS_SECRET)),
        ("producer", lambda r: r.hset(keys.caps("acme"), "tool:x", "{}")),
        ("producer", lambda r: r.hgetall(keys.session("acme", "s1"))),
        ("producer", lambda r: r.xrange(keys.DISCOVERY_REQUESTS)),
        ("producer", lambda r: r.flushall()),
        ("discovery", lambda r: r.hset(keys.caps("acme"), "tool:x", "{}")),
        ("discovery", lambda r: r.lpush(keys.INDEXING_QUEUE, "{}")),
        ("monitor", lambda r: r.set(keys.EPOCH, "x")),
        ("monitor", lambda r: r.xrange(keys.DISCOVERY_REQUESTS)),  # requests carry tokens
        ("monitor", lambda r: r.get(keys.SESSIONS_SECRET)),
        ("monitor", lambda r: r.hgetall(keys.session("acme", "s1"))),
        ("monitor", lambda r: r.zrange(keys.sessions("acme"), 0, -1)),
        ("monitor", lambda r: r.lrange(keys.INDEXING_QUEUE, 0, -1)),
        ("monitor", lambda r: r.get("another-application:key")),
        ("monitor", lambda r: r.hgetall(keys.session("acme", "s1:caps"))),  # ends like caps
        ("indexing", lambda r: r.config_get("requirepass")),
        ("indexing", lambda r: r.xrange(keys.DISCOVERY_REQUESTS)),
        ("indexing", lambda r: r.get(keys.SESSIONS_SECRET)),
        ("indexing", lambda r: r.hgetall(keys.session("acme", "s1"))),
        ("indexing", lambda r: r.get(keys.query_vectors("0" * 64))),
        ("indexing", lambda r: r.lrange(keys.reply("r1"), 0, -1)),
        ("indexing", lambda r: r.lrange(keys.session("acme", "x.reply.celery.pidbox"), 0, -1)),
        ("indexing", lambda r: r.get("another-application:key")),
    ],
)
def test_a_role_cannot_go_beyond_its_keys_and_commands(
    acl_stack: AclStack, role: str, what: Any
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        what(acl_stack.connection(role))


def test_the_default_user_is_off(acl_stack: AclStack) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_stack.port, socket_connect_timeout=2).ping()


def test_a_command_its_redis_user_may_not_run_says_so_without_a_traceback(
    acl_stack: AclStack,
) -> None:
    result = acl_stack.cli("status", role="client")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "error: Redis refused" in result.stderr and "infra/README.md" in result.stderr


def test_a_discovery_worker_run_as_a_user_without_its_permissions_says_which_user_it_needs(
    acl_stack: AclStack,
) -> None:
    worker = subprocess.run(
        DISCOVERY_ARGV,
        env=acl_stack.env("client"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    said = worker.stdout + worker.stderr
    assert worker.returncode == 2
    assert "Traceback" not in said
    assert "redis_permission_refused" in said and "capdisc-discovery" in said
