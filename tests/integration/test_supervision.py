"""``capdisc up`` supervises its children: a worker or Redis that dies is reaped and restarted and
``capdisc status`` counts it; SIGINT and SIGTERM stop everything however ``up`` was started; a
killed ``up`` leaves no child behind. Each test runs an ``up`` of its own (:mod:`.upstack`). The
watcher ``up`` runs rides out a Redis outage (on a Redis of the test's own)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from capdisc import keys
from capdisc.client import Answer, Client
from capdisc.errors import DiscoveryTimeout, RedisUnavailableError
from capdisc.localredis import start_redis
from capdisc.status import heartbeat, read_heartbeats

from .conftest import EXAMPLES
from .private import PrivateStack, copy_registry, watcher_running
from .upstack import CLI, UpProcess, alive, start_up, wait_for

__all__ = ["start_up"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(180)

Start = Callable[..., UpProcess]
SLACK = Path("examples/registry/communication/slack-post-message/CAPABILITY.yaml")


def answered_by_another_worker(up: UpProcess, old_worker: str) -> Answer | None:
    """A discovery answer from a worker other than ``old_worker``, or None (not yet)."""
    with Client(up.connection(), tenant="default", timeout_s=2, token=up.token) as client:
        try:
            answer = client.discover("post a message to the team's slack channel")
        except (DiscoveryTimeout, RedisUnavailableError, redis.ConnectionError):
            return None
    return answer if answer.worker != old_worker else None


def supervised(up: UpProcess, name: str) -> dict[str, object]:
    child: dict[str, object] = up.status()["supervised"].get(name, {})
    return child


def restarted(up: UpProcess, name: str, old_pid: int) -> bool:
    """``stack.json`` names a new live pid for ``name``."""
    pid = up.children().get(name)
    return pid is not None and pid != old_pid and alive(pid)


def reaped(pid: int) -> bool:
    """Gone, zombie included: ``up`` waited for it."""
    return not Path(f"/proc/{pid}").exists()


def edit_and_await_served(up: UpProcess) -> int:
    """Edit a watched manifest; the index version a discovery worker then serves."""
    connection = up.connection()
    before = int(connection.get(keys.version("default")) or 0)
    manifest = up.project / SLACK
    manifest.write_text(
        manifest.read_text().replace("description:", "description: Edited while supervised.", 1)
    )
    wait_for(
        lambda: int(connection.get(keys.version("default")) or 0) > before,
        60,
        "the watcher publishing the edit and the indexing worker applying it",
    )
    version = int(connection.get(keys.version("default")) or 0)
    with Client(connection, tenant="default", timeout_s=30, token=up.token) as client:
        return client.discover("post to slack", min_version=version).index_version


def test_a_killed_discovery_worker_is_reaped_restarted_and_counted(start_up: Start) -> None:
    up = start_up()
    old = up.children()["discovery"]
    old_worker = next(w["id"] for w in up.status()["workers"] if w["kind"] == "discovery")

    os.kill(old, signal.SIGKILL)

    answer = wait_for(
        lambda: answered_by_another_worker(up, old_worker), 60, "a new discovery worker answering"
    )
    new = up.children()["discovery"]
    assert answer.worker.endswith(f":{new}") and new != old
    assert answer.ids, "the restarted worker serves the registry"
    assert reaped(old)
    child = supervised(up, "discovery")
    assert (child["pid"], child["restarts"], child["last_exit"]) == (new, 1, "killed by SIGKILL")
    assert supervised(up, "indexing")["restarts"] == 0
    text = up.cli("status").stdout
    assert f"discovery pid {new} (1 restart" in text and "killed by SIGKILL" in text
    output = up.output()
    assert f"discovery (pid {old}) exited: killed by SIGKILL" in output
    assert "Last lines of" in output and "discovery.log" in output
    assert old_worker not in {w["id"] for w in up.status()["workers"]}


def test_a_killed_indexing_worker_is_restarted_and_applies_the_next_edit(start_up: Start) -> None:
    up = start_up()
    old = up.children()["indexing"]

    os.kill(old, signal.SIGKILL)

    wait_for(lambda: restarted(up, "indexing", old), 30, "the indexing worker restarting")
    new = up.children()["indexing"]
    served = edit_and_await_served(up)
    assert served > 0 and reaped(old)
    child = supervised(up, "indexing")
    assert (child["pid"], child["restarts"], child["last_exit"]) == (new, 1, "killed by SIGKILL")
    assert new in {w["pid"] for w in up.status()["workers"] if w["kind"] == "indexing"}


def test_a_killed_redis_comes_back_on_its_port_with_its_data_and_the_watcher_resyncs(
    start_up: Start,
) -> None:
    up = start_up()
    url, old = up.redis_url, up.children()["redis"]
    capabilities = int(up.connection().hlen(keys.caps("default")))

    os.kill(old, signal.SIGKILL)

    wait_for(lambda: restarted(up, "redis", old), 30, "redis-server restarting")
    assert up.redis_url == url
    assert int(up.connection().hlen(keys.caps("default"))) == capabilities  # AOF: data kept
    assert edit_and_await_served(up) > 0  # the watcher survived the outage
    child = supervised(up, "redis")
    assert (child["restarts"], child["last_exit"]) == (1, "killed by SIGKILL")
    assert up.process.poll() is None


@pytest.mark.parametrize(
    ("signum", "ignore_sigint"),
    [
        (signal.SIGINT, True),  # a script's background job: the shell set SIGINT to SIG_IGN
        (signal.SIGTERM, False),
    ],
    ids=["sigint-ignored-by-the-parent", "sigterm"],
)
def test_a_stop_signal_stops_up_and_every_child_and_removes_the_stack_file(
    start_up: Start, signum: int, ignore_sigint: bool
) -> None:
    up = start_up(ignore_sigint=ignore_sigint)
    children = up.children()
    url = up.redis_url

    up.process.send_signal(signum)

    assert up.process.wait(timeout=60) == 0, up.output()
    assert not [name for name, pid in children.items() if alive(pid)]
    assert not up.stack_file.exists()
    assert "capdisc stopped." in up.output()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_a_second_up_in_the_same_project_is_refused_and_leaves_the_first_serving(
    start_up: Start,
) -> None:
    first = start_up()
    stack_before = first.stack_file.read_text()

    second = subprocess.run(
        [*CLI, "up"], cwd=first.project, env=first.env, capture_output=True, text=True, timeout=60
    )

    assert second.returncode == 2, second.stdout + second.stderr
    assert f"a capdisc stack already runs in {first.project}" in second.stderr
    assert f"pid {first.process.pid}" in second.stderr
    assert first.process.poll() is None
    assert first.stack_file.read_text() == stack_before
    with Client(first.connection(), tenant="default", token=first.token) as client:
        assert client.discover("post a message to the team's slack channel").capabilities


def test_a_killed_up_leaves_no_child_alive(start_up: Start) -> None:
    up = start_up()
    children = up.children()
    url = up.redis_url

    up.process.kill()
    up.process.wait(timeout=10)

    wait_for(
        lambda: not any(alive(pid) for pid in children.values()),
        15,
        f"every child of the killed up exiting ({children})",
    )
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_the_watcher_rides_out_a_redis_outage_and_resyncs_what_redis_lost(tmp_path: Path) -> None:
    registry = copy_registry(tmp_path / "registry", lambda p: "communication" in p.parts)
    count = len(list(registry.rglob("CAPABILITY.yaml")))
    with PrivateStack(tmp_path / "stack", durable=False) as stack, capture_logs() as logs:
        stack.spawn_indexing()
        with watcher_running(stack.url, registry, "outage") as watcher:
            connection = stack.connection()
            wait_for(
                lambda: connection.hlen(keys.caps("outage")) == count, 60, "the first sync applied"
            )
            stack.stop_process("indexing")  # not under test: a new one comes with Redis
            stack.stop_redis()
            manifest = registry / SLACK.relative_to("examples/registry")
            manifest.write_text(
                manifest.read_text().replace(
                    "description:", "description: Edited while Redis was away.", 1
                )
            )
            wait_for(
                lambda: [e for e in logs if e["event"] == "redis_unavailable"],
                30,
                "the watcher finding Redis gone",
            )
            stack.start_redis(lose_data=True)
            stack.spawn_indexing()

            wait_for(
                lambda: _stored_count(connection) == count,
                60,
                "the watcher publishing the whole registry again",
            )
            assert b"Edited while Redis was away." in connection.hget(
                keys.caps("outage"), "tool:slack-post-message"
            )
            assert watcher.is_alive()
            events = [e["event"] for e in logs]
            assert events.count("redis_unavailable") == 1 and "redis_back" in events


def _stored_count(connection: redis.Redis) -> int:
    try:
        return int(connection.hlen(keys.caps("outage")))
    except redis.ConnectionError:
        return -1


def test_the_watcher_resyncs_what_a_redis_emptied_without_a_restart_lost(tmp_path: Path) -> None:
    registry = copy_registry(tmp_path / "registry", lambda p: "communication" in p.parts)
    count = len(list(registry.rglob("CAPABILITY.yaml")))
    with PrivateStack(tmp_path / "stack", durable=False) as stack, capture_logs() as logs:
        stack.spawn_indexing()
        with watcher_running(stack.url, registry, "emptied") as watcher:
            connection = stack.connection()
            wait_for(
                lambda: connection.hlen(keys.caps("emptied")) == count, 60, "the first sync applied"
            )
            connection.flushall()  # same run id: only the data is gone

            wait_for(
                lambda: connection.hlen(keys.caps("emptied")) == count,
                60,
                "the watcher publishing the whole registry again",
            )
            assert watcher.is_alive()
            assert "registry_lost" in [e["event"] for e in logs]


def test_a_redis_whose_data_files_cannot_be_loaded_says_why_and_how_to_repair(
    tmp_path: Path,
) -> None:
    data = tmp_path / "appendonlydir"
    data.mkdir()
    (data / "appendonly.aof.manifest").write_text("file appendonly.aof.9.base.rdb seq 9 type b\n")

    with pytest.raises(RedisUnavailableError) as refused:
        start_redis(tmp_path, durable=True).stop()  # stopped should it start after all

    said = str(refused.value)
    assert "appendonly.aof.9.base.rdb" in said and str(tmp_path / "redis.log") in said
    assert f"redis-check-aof --fix {data / 'appendonly.aof.manifest'}" in said
    assert f"move {data} aside" in said


def test_a_damaged_heartbeat_does_not_take_up_down_when_a_child_exits(
    connection: redis.Redis,
) -> None:
    import json
    import socket

    from capdisc_producers.stack import _forget_heartbeats

    exited = {"id": "discovery@exited", "kind": "discovery", "pid": 9_999_991, "last_seen_ms": 1}
    exited["host"] = socket.gethostname()
    connection.hset(keys.WORKERS, mapping={"by-hand": "5", exited["id"]: json.dumps(exited)})

    try:
        _forget_heartbeats(connection, 9_999_991)  # what `up` runs when that child exits
    finally:
        connection.hdel(keys.WORKERS, "by-hand")

    assert not connection.hexists(keys.WORKERS, exited["id"])


def test_up_started_again_soon_after_an_unclean_stop_waits_for_its_own_workers(
    tmp_path: Path,
) -> None:
    server = start_redis(tmp_path / "redis", durable=False)
    finished = subprocess.Popen(["true"])  # its pid: a worker that no longer runs
    finished.wait()
    connection = redis.Redis.from_url(server.url)
    for kind in ("indexing", "discovery"):  # fresh heartbeats of the workers of a killed up
        info = {"kind": kind, "pid": finished.pid, "host": socket.gethostname()}
        heartbeat(connection, f"{kind}@old", info)
    shutil.copytree(EXAMPLES, tmp_path / "project" / "examples" / "registry")
    up = UpProcess(tmp_path / "project", env={"CAPDISC_REDIS_URL": server.url})
    try:
        up.wait_for_output("workers started")
        children = up.children()
        beating = {
            entry["kind"]
            for entry in read_heartbeats(connection).values()
            if entry.get("pid") == children.get(entry["kind"])
        }
    finally:
        up.kill_all()
        server.stop()

    assert beating == {"indexing", "discovery"}, up.output()
