"""Whether ``capdisc mcp`` publishes an upstream's changed tools: only with an import token the
indexing workers would accept (real keys and tokens, checked by the workers' own gate); a
token they would refuse publishes nothing and says why, at start and with each change."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import pytest
import redis
from mcp import Client as MCPClient
from structlog.testing import capture_logs

from capdisc.identity import auth
from capdisc.identity.gate import Gate
from capdisc.registry.policy import SyncPlan
from capdisc.settings import Settings
from capdisc_producers.mcp_import import ListingTap, ServerTools
from capdisc_producers.mcp_reimport import Reimporter, refused_reasons, write_refusal
from capdisc_producers.mcp_server import ServerAuth, upstream_pool
from capdisc_producers.mcp_upstream import Upstream, UpstreamPool, _Connection
from capdisc_producers.sync import SyncReport

NOW = 1_800_000_000.0
HARBOUR = Upstream("mcp:python harbour.py", argv=("python", "harbour.py"))
LISTING = ServerTools("harbour-master", [{"name": "get_tide_tables", "inputSchema": {}}])
#: A Redis that is never there (a socket file that does not exist): a re-importer that tries to
#: publish fails at once with ConnectionError, one that skips never touches it.
NOWHERE = "unix:///nonexistent/capdisc-test/redis.sock"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    path = tmp_path_factory.mktemp("keys") / "auth_keys.json"
    auth.save_keyring(path, auth.Keyring([auth.new_key(NOW)]))
    return Gate(auth.KeyringFile(path), clock=lambda: NOW)


def token(
    gate: Gate, tenant: str = "acme", grants: tuple[str, ...] = ("write",), now: float = NOW
) -> str:
    """A token signed by the gate's keyring, for user alice."""
    assert gate.keys is not None
    return auth.issue(
        gate.keys.current(), tenant=tenant, user="alice", grants=grants, ttl_s=600, now=now
    )


READER = ("discover", "session")
#: (case, the import token's tenant, grants and issue time, what the refusal says; None: the
#: workers would apply its events)
CASES: list[tuple[str, str, tuple[str, ...], float, str | None]] = [
    ("write-grant", "acme", ("write",), NOW, None),
    ("admin-of-every-tenant", "*", ("admin",), NOW, None),
    ("discover-and-session", "acme", READER, NOW, "lacks the 'write' grant"),
    ("another-tenant", "other", ("write",), NOW, "wrong tenant"),
    ("expired", "acme", ("write",), NOW - 3600, "expired"),
]


@pytest.mark.parametrize(
    ("tenant", "grants", "issued", "says"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_import_token_must_grant_write_on_the_tenant(
    gate: Gate, tenant: str, grants: tuple[str, ...], issued: float, says: str | None
) -> None:
    refusal = write_refusal(gate, token(gate, tenant, grants, issued), "acme")

    assert refusal is None if says is None else says in (refusal or "")


def test_without_a_token_auth_on_refuses_and_auth_off_publishes(gate: Gate) -> None:
    assert "no identity token" in (write_refusal(gate, None, "acme") or "")
    assert write_refusal(Gate(None), None, "acme") is None


def test_without_a_tenant_the_tokens_own_is_checked(gate: Gate) -> None:
    assert write_refusal(gate, token(gate, tenant="other"), None) is None
    assert "'write' grant" in (write_refusal(gate, token(gate, grants=("session",)), None) or "")


def reimport(reimporter: Reimporter, *tenants: str) -> list[dict[str, object]]:
    with capture_logs() as logs:
        anyio.run(reimporter, HARBOUR, LISTING, frozenset(tenants))
    return logs


def test_a_token_that_may_not_write_publishes_nothing_and_says_why(gate: Gate) -> None:
    reader = token(gate, grants=READER)

    logs = reimport(Reimporter(NOWHERE, reader, wait_s=1.0, gate=gate), "acme", "beta")

    assert [(e["event"], e["tenant"]) for e in logs] == [
        ("mcp_upstream_reimport_skipped", "acme"),
        ("mcp_upstream_reimport_skipped", "beta"),
    ]
    assert "lacks the 'write' grant" in str(logs[0]["reason"])
    assert "wrong tenant" in str(logs[1]["reason"])
    hint = str(logs[0]["hint"])
    assert "--import-token" in hint and "CAPDISC_MCP_IMPORT_TOKEN" in hint
    assert reader not in repr(logs)


@pytest.mark.parametrize("auth_on", [True, False], ids=["write-grant", "auth-off"])
def test_a_token_that_may_write_or_auth_off_publishes(gate: Gate, auth_on: bool) -> None:
    reimporter = Reimporter(NOWHERE, token(gate), wait_s=1.0, gate=gate if auth_on else None)

    with capture_logs() as logs, pytest.raises(redis.ConnectionError):  # it went to publish
        anyio.run(reimporter, HARBOUR, LISTING, frozenset({"acme"}))
    assert not logs


def start(
    gate: Gate, environ: dict[str, str], process_token: str | None
) -> list[dict[str, object]]:
    settings = Settings.load(environ={"CAPDISC_REDIS_URL": NOWHERE, **environ})
    with capture_logs() as logs:
        upstream_pool(settings, ServerAuth(process_token, gate), "acme")
    return logs


def test_at_start_a_process_token_that_may_not_write_is_said_once(gate: Gate) -> None:
    reader = token(gate, grants=READER)

    logs = start(gate, {}, reader)

    assert [e["event"] for e in logs] == ["mcp_upstream_reimport_off"]
    assert "lacks the 'write' grant" in str(logs[0]["reason"])
    assert "--import-token" in str(logs[0]["hint"])
    assert logs[0]["subject"] == "alice"
    assert reader not in repr(logs)


def test_the_import_token_setting_is_used_instead_of_the_process_token(gate: Gate) -> None:
    reader = token(gate, grants=READER)
    writer = token(gate)

    assert start(gate, {"CAPDISC_MCP_IMPORT_TOKEN": writer}, reader) == []
    settings = Settings.load(environ={"CAPDISC_MCP_IMPORT_TOKEN": writer})
    assert settings.mcp_import_token == writer and writer not in repr(settings)


def test_at_start_nothing_is_said_with_auth_off_or_without_the_keyring() -> None:
    assert start(Gate(None), {}, None) == []


def test_the_pool_reimports_with_the_import_token(gate: Gate) -> None:
    writer = token(gate)
    settings = Settings.load(environ={"CAPDISC_MCP_IMPORT_TOKEN": writer})

    pool = upstream_pool(settings, ServerAuth(None, gate), "acme")

    assert isinstance(pool.on_tools_changed, Reimporter)
    assert (pool.on_tools_changed.token, pool.on_tools_changed.gate) == (writer, gate)


def test_events_the_workers_refused_are_counted_with_their_reasons() -> None:
    lacks = "the token (subject 'alice') lacks the 'write' grant this needs"
    outcomes = [
        {"decision": "rejected", "reason": lacks},
        {"decision": "rejected", "reason": lacks},
        {"decision": "upsert", "version": 7},
    ]
    report = SyncReport(Path("mcp:harbour"), SyncPlan(), "b1", sent=3, outcomes=outcomes)

    assert refused_reasons(report) == {"refused": 2, "reasons": [lacks]}
    assert refused_reasons(SyncReport(Path("mcp:harbour"), SyncPlan(), "b2", sent=0)) == {}


class ListingClient:
    """Stands in for the ``mcp`` client of a pooled connection: lists no tools, counting how
    often it is asked."""

    server_info = None
    protocol_version = "2025-11-25"

    def __init__(self) -> None:
        self.listings = 0

    async def list_tools(self, cursor: str | None = None, cache_mode: str = "") -> Any:
        self.listings += 1
        return types.ListToolsResult(tools=[])


def test_a_burst_of_tool_list_changes_is_one_relisting_and_one_after_it() -> None:
    client = ListingClient()
    release = anyio.Event()
    heard: list[ServerTools] = []

    async def changed(_upstream: Upstream, listing: ServerTools, _tenants: frozenset[str]) -> None:
        heard.append(listing)
        await release.wait()

    async def body() -> None:
        async with UpstreamPool(5, changed).running() as pool:
            connection = _Connection(Upstream("mcp:burst", argv=("burst",)))
            connection.client = cast(MCPClient, client)
            connection.tap = ListingTap(None)  # nothing on the wire: the client's pages are read
            change = types.ToolListChangedNotification()
            for _ in range(200):  # a burst before the first re-listing starts
                await pool._heard(connection, change)
            await anyio.wait_all_tasks_blocked()  # the first is re-importing, held
            for _ in range(200):  # a burst while it is held
                await pool._heard(connection, change)
            release.set()
            await anyio.wait_all_tasks_blocked()

    anyio.run(body)

    assert client.listings == 2 and len(heard) == 2
