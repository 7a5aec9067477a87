"""Redis going away does not end a discovery worker (or ``capdisc mcp``): with its data kept or
lost, the same worker process answers again soon after Redis is back, says so once in its log,
and after a data loss serves its last snapshot until the registry is published again, then
reloads it whole (its versions start again at 1). Each test runs its own Redis and workers, so
the suite's shared stack is never disturbed."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import CallToolResult
from structlog.testing import capture_logs

from capdisc import keys
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Answer, Client
from capdisc.errors import CapdiscError, RedisUnavailableError
from capdisc.sessions import store
from capdisc.sessions.policy import SessionEvent, SessionPolicy, SessionState, bind
from capdisc_workers.intake import RawEntry, RequestStream

from .conftest import ROOT, publish
from .private import PrivateStack, copy_registry, publish_and_serve, wait_for

TENANT = "restart"
PULL_REQUEST = "tool:github-create-pull-request"
#: Answers must resume within this long after Redis is back (the backoff is capped at 1 s).
RESUME_S = 2.0


def ask(stack: PrivateStack, query: str = "open a pull request", timeout_s: float = 10) -> Answer:
    with Client(stack.connection(), tenant=TENANT, timeout_s=timeout_s) as client:
        return client.discover(query)


def started(tmp_path: Path) -> tuple[PrivateStack, Answer]:
    """Redis (durable), an indexing and a discovery worker, the example registry served."""
    stack = PrivateStack(tmp_path, durable=True)
    try:
        stack.spawn_indexing()
        stack.spawn_discovery()
        publish_and_serve(stack, copy_registry(tmp_path / "registry"), TENANT)
        return stack, ask(stack)
    except BaseException:
        stack.close()
        raise


def restart(stack: PrivateStack, *, lose_data: bool, outage_s: float = 0.0) -> float:
    """Stop Redis, wait until the discovery worker noticed, keep it away ``outage_s`` more,
    start it again (wiped, with ``lose_data``); when it was back (monotonic)."""
    stack.stop_process("indexing")  # not under test here; publishing again starts a new one
    stack.stop_redis()
    wait_for(
        lambda: stack.events("discovery", "redis_unavailable"),
        10,
        "the discovery worker noticing Redis is gone",
    )
    time.sleep(outage_s)  # the outage itself: long enough for the backoff to reach its cap
    stack.start_redis(lose_data=lose_data)
    return time.monotonic()


def answer_after(stack: PrivateStack, back_at: float) -> tuple[Answer, float]:
    """The first answer once Redis is back, and how long after it came back it arrived."""
    deadline = back_at + 15
    while True:
        try:
            answer = ask(stack, timeout_s=1.0)
            return answer, time.monotonic() - back_at
        except Exception:
            if time.monotonic() > deadline:
                raise


def test_a_redis_restart_with_its_data_kept_leaves_the_worker_serving(tmp_path: Path) -> None:
    stack, before = started(tmp_path)
    with stack:
        worker = stack.processes["discovery"]
        back_at = restart(stack, lose_data=False, outage_s=3.0)

        answer, resumed_after_s = answer_after(stack, back_at)

        assert worker.poll() is None and stack.processes["discovery"].pid == worker.pid
        assert answer.ids == before.ids and answer.ids[0] == PULL_REQUEST
        assert answer.index_version == before.index_version
        assert resumed_after_s <= RESUME_S, f"answers resumed {resumed_after_s:.2f} s after"
        wait_for(lambda: stack.events("discovery", "redis_reconnected"), 10, "reconnected log")
        assert len(stack.events("discovery", "redis_unavailable")) == 1
        reconnected = stack.events("discovery", "redis_reconnected")
        assert len(reconnected) == 1 and reconnected[0]["outage_s"] > 0
        assert not stack.events("discovery", "redis_data_lost")


def test_a_client_asking_while_redis_is_away_is_answered_once_it_is_back(tmp_path: Path) -> None:
    stack, before = started(tmp_path)
    with stack:
        stack.stop_process("indexing")
        stack.stop_redis()
        asking, outcome = threading.Event(), {}

        def ask_across_the_outage() -> None:
            asking.set()
            try:
                outcome["answer"] = ask(stack, timeout_s=30)
            except Exception as exc:  # reported below
                outcome["error"] = exc

        thread = threading.Thread(target=ask_across_the_outage)
        thread.start()
        assert asking.wait(5)
        time.sleep(4.0)  # the outage: longer than redis-py's own retries of one command
        stack.start_redis(lose_data=False)
        thread.join(40)

        assert "error" not in outcome, outcome.get("error")
        assert outcome["answer"].ids == before.ids


def test_a_client_whose_redis_stays_away_gets_a_capdisc_error_saying_so() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Client(redis.Redis(port=port, socket_connect_timeout=0.5), timeout_s=1.0)

    with pytest.raises(RedisUnavailableError, match="cannot reach its Redis") as raised:
        client.discover("open a pull request")

    assert isinstance(raised.value, CapdiscError)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)


def test_a_redis_restart_that_lost_its_data_serves_the_last_snapshot_then_the_new_registry(
    tmp_path: Path,
) -> None:
    stack, before = started(tmp_path)
    with stack:
        worker = stack.processes["discovery"]
        back_at = restart(stack, lose_data=True)

        answer, resumed_after_s = answer_after(stack, back_at)  # the consumer group is gone too

        assert answer.ids == before.ids and answer.index_version == before.index_version
        assert resumed_after_s <= RESUME_S, f"answers resumed {resumed_after_s:.2f} s after"
        wait_for(lambda: stack.events("discovery", "redis_data_lost"), 10, "data loss noticed")

        # published again: a smaller registry, so its versions stay below the ones served
        smaller = copy_registry(tmp_path / "smaller", lambda d: d.name.startswith("github"))
        fresh = smaller / "dev" / "zz-brand-new"
        fresh.mkdir(parents=True)
        (fresh / "CAPABILITY.yaml").write_text(
            "name: zz-brand-new\nkind: tool\ndescription: Polishes brass doorknobs "
            "until they gleam.\n"
        )
        stack.spawn_indexing("indexing-2")
        version = publish(stack.url, smaller, TENANT, wait_s=90).index_version
        assert 0 < version < before.index_version

        reloaded = wait_for(
            lambda: _served(ask(stack, "polish the brass doorknobs"), version),
            15,
            "the registry published again being served",
        )
        assert reloaded.ids[0] == "tool:zz-brand-new"
        assert PULL_REQUEST in ask(stack).ids
        assert "tool:slack-post-message" not in ask(stack, "post a message to slack").ids
        assert worker.poll() is None and stack.processes["discovery"].pid == worker.pid
        assert len(stack.events("discovery", "redis_data_lost")) == 1
        assert len(stack.events("discovery", "redis_unavailable")) == 1


def test_capdisc_mcp_gives_tool_errors_while_redis_is_away_logs_it_once_and_answers_after(
    tmp_path: Path,
) -> None:
    stack, _before = started(tmp_path)
    log = tmp_path / "gateway.log"
    results: dict[str, CallToolResult] = {}
    away: list[CallToolResult] = []
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "capdisc_producers.cli", "mcp", "--tenant", TENANT],
        env=stack.env,
        cwd=str(ROOT),
    )

    async def body() -> None:
        with log.open("w") as errlog:
            async with MCPClient(stdio_client(server, errlog=errlog)) as mcp:
                results["before"] = await mcp.call_tool(METATOOL_NAME, {"query": "open a PR"})
                stack.stop_process("indexing")
                stack.stop_redis()
                for _ in range(2):  # two failures, one outage: logged once
                    away.append(await mcp.call_tool(METATOOL_NAME, {"query": "open a PR"}))
                stack.start_redis(lose_data=False)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    results["after"] = await mcp.call_tool(METATOOL_NAME, {"query": "open a PR"})
                    if not results["after"].is_error:
                        break

    with stack:
        anyio.run(body)

        assert not results["before"].is_error
        assert all(r.is_error and "cannot reach its Redis" in _text(r) for r in away)
        assert not results["after"].is_error, _text(results["after"])
        assert _structured(results["after"])["capabilities"][0]["id"] == PULL_REQUEST
        assert stack.processes["discovery"].poll() is None
    events = [e["event"] for e in _json_lines(log) if str(e.get("event")).startswith("redis_")]
    assert events == ["redis_unavailable", "redis_reconnected"]


def _json_lines(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                found.append(record)
    return found


def _served(answer: Answer, version: int) -> Answer | None:
    return answer if answer.index_version == version else None


def _text(result: CallToolResult) -> str:
    block = result.content[0]
    return block.text if block.type == "text" else ""


def _structured(result: CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_a_worker_started_before_redis_waits_for_it(tmp_path: Path) -> None:
    with PrivateStack(tmp_path, durable=True) as stack:
        stack.stop_redis()
        worker = stack.spawn_discovery()
        wait_for(
            lambda: stack.events("discovery", "redis_unavailable"),
            30,
            "the worker noticing Redis is not there",
        )
        stack.start_redis(lose_data=False)
        stack.spawn_indexing()

        publish_and_serve(stack, copy_registry(tmp_path / "registry"), TENANT)

        assert ask(stack).ids[0] == PULL_REQUEST and worker.poll() is None


def test_a_read_waiting_when_redis_is_emptied_recreates_the_group_without_an_error(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path, durable=False) as stack, capture_logs() as logs:
        connection = stack.connection()
        requests = RequestStream(connection, "reader", claim_idle_ms=1000, reply_ttl_s=60)
        read: list[list[RawEntry]] = []
        reader = threading.Thread(target=lambda: read.append(requests.read(block_ms=4000)))
        reader.start()
        wait_for(
            lambda: int(connection.info("clients")["blocked_clients"]) == 1, 10, "the read waiting"
        )
        connection.flushall()
        reader.join(timeout=10)

        assert read == [[]]
        assert "request_group_missing" in [e["event"] for e in logs]
        connection.xadd(keys.DISCOVERY_REQUESTS, {"request": "after"})
        assert [fields for _id, fields in requests.read(block_ms=1000)] == [{b"request": b"after"}]


def _bound(stack: PrivateStack, tool: str) -> None:
    """A change to session s1 (``tool`` bound), with its event on the session's stream."""
    policy = SessionPolicy()
    now = int(time.time() * 1000)

    def change(state: SessionState) -> tuple[SessionState, list[SessionEvent], None]:
        state, events = bind(state, [tool], now, policy)
        return state, events, None

    store.update(stack.connection(), TENANT, "s1", change, policy, now)


@pytest.mark.parametrize("lose_data", [False, True], ids=["data-kept", "data-lost"])
def test_a_session_watcher_rides_out_a_redis_restart(tmp_path: Path, lose_data: bool) -> None:
    with PrivateStack(tmp_path, durable=not lose_data) as stack:
        stack.connection().sadd(keys.TENANTS, TENANT)
        stack.spawn_discovery()  # it names the session's stream to the watcher
        _bound(stack, "tool:a")
        client = Client(stack.connection(), tenant=TENANT, timeout_s=30.0)
        seen: list[str] = []
        failed: list[BaseException] = []

        def watch() -> None:
            try:
                for event in client.watch_session("s1", stop=lambda: len(seen) >= 2):
                    seen.append(event["tool"])
            except Exception as exc:  # reported below
                failed.append(exc)

        watcher = threading.Thread(target=watch)
        watcher.start()
        wait_for(lambda: seen, 30, "the first event")
        stack.stop_redis()
        stack.start_redis(lose_data=lose_data)
        if lose_data:  # the registry published again; the stream gets a new secret's name
            stack.connection().sadd(keys.TENANTS, TENANT)
        _bound(stack, "tool:b")
        watcher.join(30)

        assert not failed, failed
        assert seen == ["tool:a", "tool:b"]


def test_a_session_watcher_whose_redis_stays_away_gets_a_capdisc_error_saying_so() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Client(redis.Redis(port=port, socket_connect_timeout=0.5), timeout_s=1.0)

    with pytest.raises(RedisUnavailableError, match="cannot reach its Redis"):
        next(iter(client.watch_session("s1")))


def test_capdisc_session_watch_follows_on_after_an_outage_longer_than_its_timeout(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path, durable=True) as stack:
        stack.connection().sadd(keys.TENANTS, TENANT)
        stack.spawn_discovery()
        _bound(stack, "tool:a")
        watcher = stack.spawn(
            "session-watch",
            [sys.executable, "-m", "capdisc_producers.cli", "session", "watch", "s1"],
            CAPDISC_TENANT=TENANT,
            CAPDISC_DISCOVER_TIMEOUT_S="1",
        )
        printed = stack.log_dir / "session-watch.log"
        wait_for(lambda: "tool:a" in printed.read_text(), 30, "the first event printed")

        stack.stop_redis()
        time.sleep(3.0)  # the outage: three times the command's timeout
        stack.start_redis(lose_data=False)
        _bound(stack, "tool:b")

        wait_for(lambda: "tool:b" in printed.read_text(), 30, "the event after the outage")
        assert watcher.poll() is None, printed.read_text()
