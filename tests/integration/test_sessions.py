"""Sessions through the real discovery workers: the working set lives in Redis, so any worker
serves any turn; every change is on the session stream in order; export/import carries it;
a request applied twice changes it once; the CLI and profiles."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.errors import ForbiddenError, UnknownProfileError
from capdisc.sessions.policy import GENERIC_LOOP_GUIDANCE, REDUNDANT_SEARCH_NOTE
from capdisc.status import live_workers

from .conftest import DISCOVERY_ARGV, Stack, publish
from .test_cli import run_cli

SLACK = "tool:slack-post-message"


def _session() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def test_a_discovery_in_a_session_binds_its_matches(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()

    answer = client.discover(
        "post a message to slack", session=session, min_version=report.index_version
    )
    working = client.working_set(session)

    assert answer.session is not None and SLACK in answer.session["bound"]
    assert [b["id"] for b in working["bound"]] == answer.session["bound"]
    assert working["bound"][0]["use_count"] == 0


def test_two_discovery_workers_serve_one_session_and_agree_on_its_working_set(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    first = client.discover("warm up", min_version=report.index_version).worker
    last = client.redis.xrevrange(keys.SERVED, count=1)
    second = stack.spawn("discovery-2", DISCOVERY_ARGV)
    _await_served_by_another(client.redis, tenant, first, last[0][0] if last else "0-0")
    session, workers = _session(), set()
    queries = [
        "post a message to slack",
        "search gmail",
        "open a pull request",
        "convert currency",
        "send an sms",
        "create a jira issue",
    ]
    deadline, turn = time.monotonic() + 60, 0
    try:
        while (len(workers) < 2 or turn < 2 * len(queries)) and time.monotonic() < deadline:
            answer = client.discover(
                queries[turn % len(queries)], session=session, min_version=report.index_version
            )
            workers.add(answer.worker)
            assert answer.session is not None
            assert [b["id"] for b in client.working_set(session)["bound"]] == answer.session[
                "bound"
            ]
            turn += 1
    finally:
        second.terminate()
        second.wait(timeout=15)

    assert len(workers) == 2, "the second discovery worker never served a turn"


#: How long a second discovery worker may take to start serving the tenant.
WORKER_START_S = 180


def _await_served_by_another(
    connection: redis.Redis, tenant: str, known: str, after: bytes | str
) -> None:
    """Block until a discovery worker other than ``known`` serves ``tenant``: its swap on the
    served stream, or (a worker that loaded the tenant at start) its heartbeat listing it. A
    starting worker loads every tenant of the suite's shared stack first (one per test that
    published before this one), which takes over a minute on a busy 2-core machine."""
    for _ in range(WORKER_START_S):
        batch = connection.xread({keys.SERVED: after}, block=1000) or []
        for _stream, entries in batch:
            for entry_id, fields in entries:
                after = entry_id
                if fields[b"tenant"].decode() == tenant and fields[b"worker"].decode() != known:
                    return
        if any(
            w["kind"] == "discovery" and w["id"] != known and tenant in w.get("versions", {})
            for w in live_workers(connection, 10.0)
        ):
            return
    tenants = connection.scard(keys.TENANTS)
    raise AssertionError(
        f"no second discovery worker served the tenant within {WORKER_START_S} s "
        f"({tenants} tenants to load)"
    )


def test_the_session_stream_shows_every_change_in_order(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    client.discover(
        "post a message to slack", session=session, limit=1, min_version=report.index_version
    )
    outcomes = [client.record_tool_call(session, SLACK, {"text": "hi"}) for _ in range(4)]
    client.discover("post a message to slack", session=session, limit=1)

    seen: list[dict[str, str]] = []
    for event in client.watch_session(session, stop=lambda: len(seen) >= 5):
        seen.append(event)

    assert [(e["type"], e["tool"]) for e in seen] == [
        ("bound", SLACK),
        ("loop_detected", SLACK),
        ("evicted", SLACK),
        ("restored", SLACK),
        ("redundant_search", ""),
    ]
    assert [o["loop_detected"] for o in outcomes] == [False, False, False, True]
    assert outcomes[-1]["evicted"] and outcomes[-1]["guidance"] == GENERIC_LOOP_GUIDANCE


def test_a_repeated_search_gets_the_redundant_search_note(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()

    first = client.discover(
        "post a message to slack", session=session, min_version=report.index_version
    )
    again = client.discover("post a message to slack", session=session)

    assert first.session is not None and not first.session["redundant_search"]
    assert again.session is not None and again.session["redundant_search"]
    assert again.session["note"] == REDUNDANT_SEARCH_NOTE
    assert again.raw["redundant_search"] and again.raw["note"] == REDUNDANT_SEARCH_NOTE
    assert again.ids == first.ids  # the search still answers


def test_export_then_import_reproduces_the_working_set(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    parent, child = _session(), _session()
    client.discover("post a message to slack", session=parent, min_version=report.index_version)
    client.record_tool_call(parent, SLACK, {"text": "hello"})

    exported = client.export_session(parent)
    working = client.import_session(child, json.loads(json.dumps(exported)))

    assert working["bound"] == client.working_set(parent)["bound"]
    assert client.working_set(child)["bound"] == working["bound"]


def test_a_request_applied_twice_changes_the_session_once(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    client.discover(
        "post a message to slack", session=session, limit=1, min_version=report.index_version
    )

    first = client.record_tool_call(session, SLACK, {"n": 1}, request_id="call-1")
    again = client.record_tool_call(session, SLACK, {"n": 1}, request_id="call-1")

    assert first == {**again, "worker": first["worker"], "took_ms": first["took_ms"]}
    assert client.working_set(session)["bound"][0]["use_count"] == 1


def test_a_profile_restricts_discovery_ranks_experts_first_and_offers_installables(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()

    refund = client.discover(
        "refund a customer's payment",
        session=session,
        profile="billing",
        min_version=report.index_version,
    )
    stocks = client.discover("latest stock price of a ticker", session=session, profile="billing")

    allowed = {
        "tool:stripe-create-invoice",
        "tool:stripe-refund",
        "tool:currency-convert",
        "tool:stock-quote",
        "skill:invoice-reconciliation",
        "tool:invoice-reconciliation",
    }
    assert set(refund.ids) <= allowed and refund.ids[0] == "tool:stripe-refund"
    assert refund.session is not None and refund.session["bound"][0] == "tool:currency-convert"
    assert stocks.session is not None
    assert [c["id"] for c in stocks.session.get("installable", [])] == ["tool:stock-quote"]
    assert all(c["installable"] for c in stocks.session["installable"])


def test_a_session_answer_in_a_tool_format_carries_the_whole_working_set(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    client.discover(
        "post a message to slack", session=session, limit=1, min_version=report.index_version
    )

    answer = client.discover("search gmail", session=session, limit=1, tool_format="openai-chat")

    assert answer.session is not None
    assert set(answer.tool_names.values()) >= set(answer.session["bound"])
    assert len(answer.session["bound"]) == 2


def test_unknown_session_is_a_clear_error(stack: Stack, registry: Path, tenant: str) -> None:
    publish(stack.url, registry, tenant)
    result = run_cli("session", "show", "nobody-here", "--tenant", tenant, env=stack.env)

    assert result.returncode == 1  # it named something capdisc does not hold
    assert "session 'nobody-here'" in result.stderr and "does not exist" in result.stderr


def test_session_cli_show_call_export_import(
    stack: Stack, registry: Path, tenant: str, tmp_path: Path, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    discovered = run_cli(
        "discover",
        "post a message to slack",
        "--session",
        session,
        "--json",
        "--tenant",
        tenant,
        "--min-version",
        str(report.index_version),
        env=stack.env,
    )
    calls = [
        run_cli(
            "session",
            "call",
            session,
            SLACK,
            "--args",
            '{"text": "x"}',
            "--json",
            "--tenant",
            tenant,
            env=stack.env,
        )
        for _ in range(4)
    ]
    shown = run_cli("session", "show", session, "--json", "--tenant", tenant, env=stack.env)
    exported = run_cli("session", "export", session, "--tenant", tenant, env=stack.env)
    (tmp_path / "s.json").write_text(exported.stdout)
    imported = run_cli(
        "session",
        "import",
        f"{session}-child",
        str(tmp_path / "s.json"),
        "--tenant",
        tenant,
        env=stack.env,
    )

    assert json.loads(discovered.stdout)["session"]["id"] == session
    last = json.loads(calls[-1].stdout)
    assert last["loop_detected"] and last["evicted"] and last["guidance"]
    working = json.loads(shown.stdout)
    assert SLACK not in [b["id"] for b in working["bound"]]
    assert {"bound", "always_include"} <= set(working)
    assert imported.returncode == 0, imported.stderr


def test_a_request_applied_again_after_many_others_still_changes_nothing(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    client.discover(
        "post a message to slack", session=session, limit=1, min_version=report.index_version
    )
    client.record_tool_call(session, SLACK, {"n": 0}, request_id="late")
    for number in range(1, 41):  # a reclaimed request can come back after dozens of turns
        client.record_tool_call(session, SLACK, {"n": number})

    client.record_tool_call(session, SLACK, {"n": 0}, request_id="late")

    assert client.working_set(session)["bound"][0]["use_count"] == 41


def test_session_watch_prints_each_change_as_it_happens(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    client.discover(
        "post a message to slack", session=session, limit=1, min_version=report.index_version
    )
    client.record_tool_call(session, SLACK, {"text": "hi"})

    watched = run_cli(
        "session", "watch", session, "--count", "1", "--json", "--tenant", tenant, env=stack.env
    )
    shown = run_cli("session", "watch", session, "--count", "1", "--tenant", tenant, env=stack.env)

    assert watched.returncode == 0, watched.stderr
    event = json.loads(watched.stdout)
    assert (event["type"], event["tool"]) == ("bound", SLACK)
    assert shown.stdout.startswith(event["id"]) and f"bound            {SLACK}" in shown.stdout


def test_only_callers_with_a_sessions_starters_roles_and_user_may_change_it(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)
    session = _session()
    finance = Client(connection, tenant=tenant, roles=["finance"])
    other = Client(connection, tenant=tenant)
    finance.discover("post a message to slack", session=session, min_version=report.index_version)

    refusals = [
        lambda: other.record_tool_call(session, SLACK, {"text": "hi"}),
        lambda: other.discover("post a message to slack", session=session),
        lambda: other.import_session(session, finance.export_session(session)),
    ]
    for refused in refusals:
        with pytest.raises(ForbiddenError, match="use a session id of your own"):
            refused()

    working = finance.working_set(session)
    assert SLACK in [b["id"] for b in working["bound"]]
    assert working["bound"][0]["use_count"] == 0  # the refused call changed nothing


def test_a_profile_not_configured_is_refused_rather_than_served_unrestricted(
    stack: Stack, registry: Path, tenant: str, client: Client
) -> None:
    report = publish(stack.url, registry, tenant)

    with pytest.raises(UnknownProfileError, match="profile 'biling' is not configured"):
        client.discover(
            "refund a customer's payment", profile="biling", min_version=report.index_version
        )
    result = run_cli("discover", "refund", "--profile", "biling", "--tenant", tenant, env=stack.env)

    assert result.returncode == 1  # it named something capdisc does not hold
    assert "'billing'" in result.stderr  # the profiles that are configured
