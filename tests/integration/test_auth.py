"""Who asks is proven: real workers with auth on, asked through every front door (the Client,
the CLI, capdisc mcp over stdio and over streamable HTTP) with missing, forged, expired and
wrong-tenant tokens (a clear error, no data), and with valid tokens whose roles decide exactly
what is seen; capdisc mcp re-imports an upstream's changed tools only with a token that may
write."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import yaml
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from capdisc import keys
from capdisc.access import Caller, visible
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client
from capdisc.errors import AuthError, ForbiddenError
from capdisc.identity import auth
from capdisc.models import Visibility
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, sync_directory

from .conftest import EXAMPLES, MAX_BYTES, ROOT, stop_process, wait_for
from .private import PrivateStack
from .test_cli import CLI, run_cli
from .test_import_mcp import free_port
from .test_mcp_gateway import HARBOUR, ListChanges, bind_harbour, text_of

SERVE = [sys.executable, "-m", "capdisc_producers.cli", "mcp"]

TENANT = "acme"
REFUND = "tool:stripe-refund"
#: Visibility given to capabilities of the example registry (the rest stay open to the tenant).
RESTRICTED = {
    "stripe-refund": {"roles": ["finance"]},
    "stripe-create-invoice": {"roles": ["finance", "billing"]},
    "github-create-pull-request": {"roles": ["eng"]},
    "slack-post-message": {"users": ["alice"]},
    "gmail-send": {"roles": ["eng"], "users": ["bob"]},
}


class AuthStack:
    """A stack of the test module's own with auth on: its keyring, workers and tokens."""

    def __init__(self, private: PrivateStack, keyring: auth.Keyring, keys_file: Path) -> None:
        self.private = private
        self.keyring = keyring
        self.keys_file = keys_file
        self.env = private.env
        self.url = private.url

    def token(
        self,
        tenant: str = TENANT,
        *,
        keyring: auth.Keyring | None = None,
        now: float | None = None,
        **fields: Any,
    ) -> str:
        fields.setdefault("grants", ["discover", "session"])
        fields.setdefault("ttl_s", 600)
        return auth.issue(
            keyring or self.keyring,
            tenant=tenant,
            now=time.time() if now is None else now,
            **fields,
        )

    def client(self, token: str | None, **kwargs: Any) -> Client:
        return Client(redis.Redis.from_url(self.url), token=token, timeout_s=20, **kwargs)


def bad_tokens(stack: AuthStack) -> dict[str, tuple[str | None, type[AuthError], str]]:
    """Tokens every front door refuses: the token, the error and what its message says."""
    impostor = auth.Keyring.from_mapping({stack.keyring.kids[-1]: "x" * 48})
    return {
        "missing": (None, AuthError, "no identity token"),
        "forged": (stack.token(keyring=impostor), AuthError, "does not verify"),
        "unknown-key": (
            stack.token(keyring=auth.Keyring.from_mapping({"k0": "y" * 48})),
            AuthError,
            "does not have",
        ),
        "expired": (stack.token(now=time.time() - 7200), AuthError, "expired"),
        "wrong-tenant": (stack.token("other"), ForbiddenError, "wrong tenant"),
    }


def restricted_registry(target: Path) -> Path:
    shutil.copytree(EXAMPLES, target)
    for name, visibility in RESTRICTED.items():
        path = next(target.glob(f"*/{name}/CAPABILITY.yaml"))
        data = yaml.safe_load(path.read_text())
        data["visibility"] = visibility
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def publish_as(url: str, registry: Path, tenant: str, token: str | None) -> SyncReport:
    publisher = Publisher(url, token=token)
    try:
        return sync_directory(
            redis.Redis.from_url(url),
            publisher,
            registry,
            tenant=tenant,
            max_bytes=MAX_BYTES,
            wait_s=90,
        )
    finally:
        publisher.close()


@pytest.fixture(scope="module")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    base = tmp_path_factory.mktemp("auth-stack")
    keys_file = base / "secrets" / "auth_keys.json"
    keyring = auth.Keyring([auth.new_key(time.time())])
    auth.save_keyring(keys_file, keyring)
    with PrivateStack(base, durable=False) as private:
        private.env.update(CAPDISC_AUTH="on", CAPDISC_AUTH_KEYS_FILE=str(keys_file))
        private.spawn_indexing()
        private.spawn_discovery()
        stack = AuthStack(private, keyring, keys_file)
        writer = stack.token(grants=["write"])
        report = publish_as(stack.url, restricted_registry(base / "registry"), TENANT, writer)
        assert report.complete, f"the registry was not applied; see {private.log_dir}"
        stack.client(stack.token(grants=["admin"])).discover(
            "warm up", min_version=report.index_version
        )
        yield stack


# -- the Client -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "forged", "unknown-key", "expired", "wrong-tenant"])
def test_client_refused_tokens_get_a_clear_error_and_no_data(
    auth_stack: AuthStack, case: str
) -> None:
    presented, error, says = bad_tokens(auth_stack)[case]
    client = auth_stack.client(presented, tenant=TENANT)

    with pytest.raises(error, match=says):
        client.discover("refund a stripe payment")
    with pytest.raises(error, match=says):
        client.working_set("any-session")
    with pytest.raises(error, match=says):
        client.import_session("any-session", {"created_ms": 1, "bound": {}})


def test_client_the_token_decides_roles_and_tenant(auth_stack: AuthStack) -> None:
    finance = auth_stack.client(auth_stack.token(roles=["finance"]))
    nobody = auth_stack.client(auth_stack.token())
    pretender = auth_stack.client(auth_stack.token(), roles=["finance"])

    shown = finance.discover("refund a stripe payment", tool_format="openai-chat")
    hidden = nobody.discover("refund a stripe payment", tool_format="openai-chat")

    assert finance.tenant == TENANT  # the token's tenant by default
    assert shown.ids[0] == REFUND and REFUND in shown.tool_names.values()
    assert REFUND not in hidden.ids and REFUND not in hidden.tool_names.values()
    assert "stripe-refund" not in hidden.raw["tiers"]["tier0"]
    with pytest.raises(ForbiddenError, match="does not carry role"):
        pretender.discover("refund a stripe payment")


def test_client_session_ops_need_the_session_grant_and_show_what_the_token_may_see(
    auth_stack: AuthStack,
) -> None:
    finance = auth_stack.client(auth_stack.token(roles=["finance"]))
    finance.discover("refund a stripe payment", session="auth-s1")
    discover_only = auth_stack.client(auth_stack.token(grants=["discover"]))
    colleague = auth_stack.client(auth_stack.token())

    mine = finance.working_set("auth-s1")
    theirs = colleague.working_set("auth-s1")
    exported = colleague.export_session("auth-s1")

    assert REFUND in [b["id"] for b in mine["bound"]]
    assert REFUND not in [b["id"] for b in theirs["bound"]]
    assert REFUND not in exported["bound"]
    with pytest.raises(ForbiddenError, match="'session' grant"):
        discover_only.import_session("auth-s2", {"created_ms": 1, "bound": {}})
    with pytest.raises(ForbiddenError, match="'session' grant"):
        discover_only.discover("refund a stripe payment", session="auth-s1")
    assert discover_only.discover("refund a stripe payment").ids  # discover alone is fine


def test_watching_a_session_needs_a_token_whose_roles_see_every_capability(
    auth_stack: AuthStack,
) -> None:
    finance = auth_stack.client(auth_stack.token(roles=["finance"]))
    finance.discover("refund a stripe payment", session="auth-w1")
    sees_all = auth_stack.client(auth_stack.token(roles=["finance", "eng"], user="alice"))
    outsider = auth_stack.client(auth_stack.token("other"), tenant=TENANT)

    first = next(iter(sees_all.watch_session("auth-w1")))

    assert first["type"] == "bound"
    with pytest.raises(ForbiddenError, match="not visible to the roles and user asking"):
        next(iter(finance.watch_session("auth-w1")))
    with pytest.raises(ForbiddenError, match="wrong tenant"):
        next(iter(outsider.watch_session("auth-w1")))


def test_a_sessions_event_stream_is_not_named_by_its_tenant_and_id_alone(
    auth_stack: AuthStack,
) -> None:
    auth_stack.client(auth_stack.token()).discover("open a pull request", session="auth-w2")
    connection = redis.Redis.from_url(auth_stack.url)
    named = f"{keys.session(TENANT, 'auth-w2')}~events"

    (stream,) = connection.scan_iter(match=f"{named}*")

    assert stream.decode().startswith(f"{named}~") and connection.xlen(stream) > 0


IDENTITIES = [
    pytest.param((), None, id="anonymous"),
    pytest.param(("finance",), None, id="finance"),
    pytest.param(("eng",), None, id="eng"),
    pytest.param(("billing", "eng"), None, id="two"),
    pytest.param((), "alice", id="alice"),
    pytest.param(("support",), "bob", id="bob"),
]
QUERIES = [
    "refund a stripe payment",
    "create an invoice for a customer",
    "open a pull request",
    "post a message to the team's slack channel",
    "send an email",
    "finance",
    "tell bob the deploy is done",
]


@pytest.mark.parametrize(("roles", "user"), IDENTITIES)
def test_no_answer_shows_a_token_holder_what_its_roles_may_not_see(
    auth_stack: AuthStack, roles: tuple[str, ...], user: str | None
) -> None:
    client = auth_stack.client(auth_stack.token(roles=list(roles), user=user))
    caller = Caller.of(roles, user)
    hidden = {
        f"tool:{name}"
        for name, v in RESTRICTED.items()
        if not visible(Visibility(tuple(v.get("roles", ())), tuple(v.get("users", ()))), caller)
    }
    session = f"leak-{'-'.join(roles) or 'none'}-{user or 'none'}"

    for query in QUERIES:
        answer = client.discover(
            query,
            tool_format="mcp",
            session=session,
            options={"tier1_min_relevance": -1.0, "tier1_top_k": 20},
        )
        shown = set(answer.ids) | set(answer.tool_names.values()) | set(answer.session["bound"])
        assert not shown & hidden, (query, shown & hidden)
        tier0 = answer.raw["tiers"]["tier0"]  # lists names by category
        assert not any(name.split(":")[1] in tier0 for name in hidden), query
    assert not {b["id"] for b in client.working_set(session)["bound"]} & hidden


def test_refusals_are_logged_with_kid_and_subject_never_the_token(auth_stack: AuthStack) -> None:
    forged, _error, _says = bad_tokens(auth_stack)["forged"]
    with pytest.raises(AuthError):
        auth_stack.client(forged).discover("refund a stripe payment")

    refused = auth_stack.private.events("discovery", "request_refused")
    log_text = (auth_stack.private.log_dir / "discovery.log").read_text()
    assert any(
        r["reason"] == "forged"
        and r["kid"] == auth_stack.keyring.kids[-1]
        and r["subject"] == f"anonymous@{TENANT}"
        for r in refused
    )
    assert forged not in log_text and forged.split(".")[2] not in log_text


def test_a_dead_lettered_request_keeps_no_token(auth_stack: AuthStack) -> None:
    connection = redis.Redis.from_url(auth_stack.url)
    presented = auth_stack.token()
    payload = json.dumps({"query": "x", "token": presented, "bogus": 1})  # no request id
    connection.xadd(keys.DISCOVERY_REQUESTS, {"payload": payload})

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        letters = [
            f for _i, f in connection.xrange(keys.DEADLETTERS) if b"bogus" in f.get(b"payload", b"")
        ]
        if letters:
            break
        time.sleep(0.05)
    assert letters, "the request was not dead-lettered"
    assert presented.encode() not in letters[0][b"payload"]
    assert b"[redacted]" in letters[0][b"payload"]


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "forged", "expired", "wrong-tenant"])
def test_cli_refused_tokens_get_a_clear_error_and_no_data(auth_stack: AuthStack, case: str) -> None:
    presented, _error, says = bad_tokens(auth_stack)[case]
    env = {**auth_stack.env, **({"CAPDISC_TOKEN": presented} if presented else {})}

    found = run_cli("discover", "refund a stripe payment", "--tenant", TENANT, "--json", env=env)
    shown = run_cli("session", "show", "auth-s1", "--tenant", TENANT, env=env)

    for result in (found, shown):
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert says in result.stderr
        assert not presented or presented not in result.stderr


def test_cli_token_flag_and_variable_prove_roles(auth_stack: AuthStack) -> None:
    finance = auth_stack.token(roles=["finance"])

    by_flag = run_cli(
        "discover", "refund a stripe payment", "--json", "--token", finance, env=auth_stack.env
    )
    by_variable = run_cli(
        "discover",
        "refund a stripe payment",
        "--json",
        env={**auth_stack.env, "CAPDISC_TOKEN": auth_stack.token()},
    )

    assert json.loads(by_flag.stdout)["capabilities"][0]["id"] == REFUND
    assert REFUND not in [c["id"] for c in json.loads(by_variable.stdout)["capabilities"]]


def test_cli_token_issue_makes_tokens_the_workers_accept(auth_stack: AuthStack) -> None:
    issued = run_cli(
        "token",
        "issue",
        "--tenant",
        TENANT,
        "--roles",
        "finance",
        "--ttl",
        "5m",
        "--keys",
        str(auth_stack.keys_file),
        env=auth_stack.env,
    )
    assert issued.returncode == 0, issued.stderr

    identity = auth.verify(issued.stdout.strip(), auth_stack.keyring, time.time())
    answer = auth_stack.client(issued.stdout.strip()).discover("refund a stripe payment")

    assert identity.roles == ("finance",) and identity.expires_at - identity.issued_at == 300
    assert answer.ids[0] == REFUND


def test_a_revoked_token_is_refused_from_the_next_request_and_its_keys_others_are_not(
    auth_stack: AuthStack,
) -> None:
    revoked, kept = (auth_stack.token(roles=["finance"]) for _ in range(2))
    client = auth_stack.client(revoked)
    assert client.discover("refund a stripe payment").ids[0] == REFUND

    result = subprocess.run(
        [*CLI, "token", "revoke", "-", "--keys", str(auth_stack.keys_file)],
        input=revoked,
        env=auth_stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    with pytest.raises(AuthError, match="revoked"):
        client.discover("refund a stripe payment")
    assert auth_stack.client(kept).discover("refund a stripe payment").ids[0] == REFUND
    token_id = auth.peek(revoked)["jti"]
    assert any(
        r["reason"] == "revoked" and r["token_id"] == token_id
        for r in auth_stack.private.events("discovery", "request_refused")
    )


# -- capdisc mcp over stdio --------------------------------------------------------------------


def mcp_env(stack: AuthStack, token: str | None, *, keyring: bool = True) -> dict[str, str]:
    env = {k: v for k, v in stack.env.items() if keyring or not k.startswith("CAPDISC_AUTH")}
    return {**env, **({"CAPDISC_TOKEN": token} if token else {})}


@pytest.mark.parametrize("case", ["missing", "forged", "expired", "wrong-tenant"])
def test_mcp_stdio_refuses_a_bad_token_at_start(auth_stack: AuthStack, case: str) -> None:
    presented, _error, says = bad_tokens(auth_stack)[case]

    result = subprocess.run(
        [*SERVE, "--tenant", TENANT],
        env=mcp_env(auth_stack, presented),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2 and result.stdout == ""
    assert says in result.stderr
    assert not presented or presented not in result.stderr


def test_mcp_stdio_asks_as_the_token_holder_and_the_workers_check_it(auth_stack: AuthStack) -> None:
    forged, _error, _says = bad_tokens(auth_stack)["forged"]
    found: dict[str, Any] = {}

    async def ask(name: str, token: str, keyring: bool = True) -> None:
        server = StdioServerParameters(
            command=SERVE[0],
            args=[*SERVE[1:], "--tenant", TENANT],
            env=mcp_env(auth_stack, token, keyring=keyring),
            cwd=str(ROOT),
        )
        async with MCPClient(server) as mcp:
            found[name] = await mcp.call_tool(METATOOL_NAME, {"query": "refund a payment"})

    async def body() -> None:
        await ask("finance", auth_stack.token(roles=["finance"]))
        await ask("plain", auth_stack.token())
        # without the keyring the server cannot check at start: the workers refuse each call
        await ask("forged", forged, keyring=False)

    anyio.run(body)
    assert found["finance"].structured_content["capabilities"][0]["id"] == REFUND
    assert REFUND not in [c["id"] for c in found["plain"].structured_content["capabilities"]]
    refused = found["forged"]
    assert refused.is_error and "does not verify" in refused.content[0].text
    assert not refused.structured_content


# -- capdisc mcp over streamable HTTP ----------------------------------------------------------


@pytest.fixture
def mcp_http(auth_stack: AuthStack, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts ``capdisc mcp --http PORT`` on the auth stack (``keyring=False``: without the
    auth settings, as a process that does not have them); returns its endpoint URL."""
    running: list[subprocess.Popen[bytes]] = []

    def start(*args: str, keyring: bool = True, **env: str) -> str:
        port = free_port()
        log = tmp_path / "mcp-http.log"
        with log.open("ab") as out:
            running.append(
                subprocess.Popen(
                    [*SERVE, "--http", str(port), *args],
                    env={**mcp_env(auth_stack, None, keyring=keyring), **env},
                    cwd=ROOT,
                    stdout=out,
                    stderr=out,
                )
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return f"http://127.0.0.1:{port}/mcp"
            except OSError:
                if running[-1].poll() is not None:
                    raise AssertionError(f"capdisc mcp exited: {log.read_text()}") from None
                time.sleep(0.05)
        raise AssertionError("capdisc mcp did not listen within 30 s")

    try:
        yield start
    finally:
        for process in running:
            stop_process(process)


def post_initialize(url: str, token: str | None) -> tuple[int, dict[str, str], str]:
    """A raw initialize POST: its status, headers and body."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }
    ).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def with_bearer(url: str, token: str) -> tuple[MCPClient, Any]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return MCPClient(streamable_http_client(url, http_client=http)), http


@pytest.mark.parametrize("case", ["missing", "forged", "unknown-key", "expired"])
def test_mcp_http_refuses_a_request_without_a_valid_bearer_token_saying_why(
    auth_stack: AuthStack, mcp_http: Callable[..., str], case: str
) -> None:
    presented, _error, says = bad_tokens(auth_stack)[case]
    url = mcp_http()

    status, headers, body = post_initialize(url, presented)

    assert status == 401
    challenge = {k.lower(): v for k, v in headers.items()}["www-authenticate"]
    assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
    assert says in challenge and says in json.loads(body)["error_description"]
    assert "result" not in body


def test_mcp_http_needs_the_discover_grant_and_refuses_another_tenant(
    auth_stack: AuthStack, mcp_http: Callable[..., str]
) -> None:
    url = mcp_http("--tenant", TENANT)
    writer_status, writer_headers, _body = post_initialize(url, auth_stack.token(grants=["write"]))
    # every MCP session is a capdisc session: without 'session' a token could only fail each call
    asker_status, _headers, _body = post_initialize(url, auth_stack.token(grants=["discover"]))
    outcome: dict[str, Any] = {}

    async def body() -> None:
        client, http = with_bearer(url, auth_stack.token("other"))
        async with http, client as mcp:
            outcome["other"] = await mcp.call_tool(METATOOL_NAME, {"query": "refund"})

    anyio.run(body)
    assert writer_status == 403 and asker_status == 403
    assert (
        "insufficient_scope"
        in {k.lower(): v for k, v in writer_headers.items()}["www-authenticate"]
    )
    refused = outcome["other"]
    assert refused.is_error and "wrong tenant" in refused.content[0].text
    assert not refused.structured_content


def test_mcp_http_each_request_asks_as_the_holder_of_its_bearer_token(
    auth_stack: AuthStack, mcp_http: Callable[..., str]
) -> None:
    url = mcp_http()
    answers: dict[str, dict[str, Any]] = {}

    async def body() -> None:
        finance, finance_http = with_bearer(url, auth_stack.token(roles=["finance"]))
        plain, plain_http = with_bearer(url, auth_stack.token())
        async with finance_http, plain_http, finance as one, plain as other:
            for name, mcp in (("finance", one), ("plain", other)):
                result = await mcp.call_tool(METATOOL_NAME, {"query": "refund a payment"})
                assert not result.is_error, result.content
                answers[name] = result.structured_content or {}

    anyio.run(body)
    assert answers["finance"]["capabilities"][0]["id"] == REFUND
    assert REFUND in answers["finance"]["session"]["bound"]
    assert REFUND not in [c["id"] for c in answers["plain"]["capabilities"]]
    assert REFUND not in answers["plain"]["session"]["bound"]


def test_mcp_http_on_a_host_an_hour_behind_takes_a_token_issued_now(
    auth_stack: AuthStack, mcp_http: Callable[..., str]
) -> None:
    from .test_clock_skew import shifted_clock

    url = mcp_http(**shifted_clock("-1h"))

    status, _headers, body = post_initialize(url, auth_stack.token())

    assert status == 200, body


def test_mcp_http_a_session_answers_only_the_holder_that_opened_it(
    auth_stack: AuthStack, mcp_http: Callable[..., str]
) -> None:
    """Two tokens of one subject (anonymous@acme) with other roles are two holders: the one
    without finance may not list what the finance holder's session bound."""
    url = mcp_http()
    finance = auth_stack.token(roles=["finance"])
    _status, headers, _body = post_initialize(url, finance)
    session = {k.lower(): v for k, v in headers.items()}["mcp-session-id"]
    post_in_session(url, finance, session, {"method": "notifications/initialized"})
    found = post_in_session(
        url,
        finance,
        session,
        {
            "id": 2,
            "method": "tools/call",
            "params": {"name": METATOOL_NAME, "arguments": {"query": "refund a stripe payment"}},
        },
    )

    status, body = post_in_session(
        url, auth_stack.token(), session, {"id": 3, "method": "tools/list", "params": {}}
    )

    assert found[0] == 200 and "stripe-refund" in found[1]
    assert status == 404 and "stripe-refund" not in body


def post_in_session(url: str, token: str, session: str, message: dict[str, Any]) -> tuple[int, str]:
    """A raw POST of a JSON-RPC ``message`` in MCP session ``session``: its status and body."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"jsonrpc": "2.0", **message}).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": "2025-11-25",
            "mcp-session-id": session,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# -- writes -----------------------------------------------------------------------------------


def one_capability(target: Path, name: str) -> Path:
    (target / name).mkdir(parents=True)
    (target / name / "CAPABILITY.yaml").write_text(
        f"name: {name}\nkind: tool\ndescription: Written by a test of who may write.\n"
    )
    return target


def stored(stack: AuthStack, tenant: str, cap_id: str) -> bool:
    return bool(redis.Redis.from_url(stack.url).hexists(keys.caps(tenant), cap_id))


@pytest.mark.parametrize("case", ["missing", "forged", "expired", "wrong-tenant", "discover-only"])
def test_indexing_workers_apply_only_events_whose_token_grants_write(
    auth_stack: AuthStack, tmp_path: Path, case: str
) -> None:
    cases = {
        **{k: v[0] for k, v in bad_tokens(auth_stack).items()},
        "discover-only": auth_stack.token(grants=["discover", "session"]),
    }
    name = f"sneaky-{case}"
    connection = redis.Redis.from_url(auth_stack.url)
    letters_before = connection.xlen(keys.DEADLETTERS)

    report = publish_as(auth_stack.url, one_capability(tmp_path / "r", name), TENANT, cases[case])

    assert report.complete
    assert [o["decision"] for o in report.outcomes] == ["rejected"]
    assert any(
        word in report.outcomes[0]["reason"] for word in ("token", "wrong tenant", "'write' grant")
    )
    assert not stored(auth_stack, TENANT, f"tool:{name}")
    letter = connection.xrange(keys.DEADLETTERS)[letters_before:][-1][1]
    assert name.encode() in letter[b"payload"]
    assert not cases[case] or cases[case].encode() not in letter[b"payload"]


def test_cli_writes_are_checked_before_sending_and_replayed_with_the_replayers_token(
    auth_stack: AuthStack, tmp_path: Path
) -> None:
    registry = one_capability(tmp_path / "r", "written-by-cli")
    reader = {**auth_stack.env, "CAPDISC_TOKEN": auth_stack.token()}
    writer = {**auth_stack.env, "CAPDISC_TOKEN": auth_stack.token(grants=["write"])}
    no_keyring = {k: v for k, v in auth_stack.env.items() if not k.startswith("CAPDISC_AUTH")}
    impostor = auth.Keyring.from_mapping({auth_stack.keyring.kids[-1]: "x" * 48})
    forged = auth_stack.token(keyring=impostor, grants=["write"])

    early = run_cli("publish", str(registry), "--tenant", TENANT, env=reader)
    late = run_cli(
        "publish", str(registry), "--tenant", TENANT, env={**no_keyring, "CAPDISC_TOKEN": forged}
    )
    missing = run_cli("delete", "tool:stripe-refund", "--tenant", TENANT, env=auth_stack.env)
    emptied = run_cli("delete", "--all", "--tenant", TENANT, env=reader)
    connection = redis.Redis.from_url(auth_stack.url)
    rejection = str(registry / "broken" / "CAPABILITY.yaml")
    connection.hset(keys.manifest_errors(TENANT), rejection, "field 'kind': ...")
    forgetting = run_cli("delete", "--source", str(registry), "--tenant", TENANT, env=reader)
    still_rejected = connection.hexists(keys.manifest_errors(TENANT), rejection)
    applied = run_cli("publish", str(registry), "--tenant", TENANT, env=writer)

    assert early.returncode == 2 and "lacks the 'write' grant" in early.stderr
    assert late.returncode == 1 and "refused by the indexing workers" in late.stderr
    assert "does not verify" in late.stderr
    assert missing.returncode == 2 and "write grant" in missing.stderr
    assert emptied.returncode == 2 and "lacks the 'write' grant" in emptied.stderr
    assert forgetting.returncode == 2 and "lacks the 'write' grant" in forgetting.stderr
    assert still_rejected
    assert stored(auth_stack, TENANT, REFUND)
    assert applied.returncode == 0, applied.stderr
    assert stored(auth_stack, TENANT, "tool:written-by-cli")

    refused = next(
        i.decode()
        for i, f in reversed(connection.xrange(keys.DEADLETTERS))
        if b"written-by-cli" in f[b"payload"]
    )
    replayed = run_cli("dlq", "replay", refused, env=writer)
    assert replayed.returncode == 0, replayed.stderr
    assert refused.encode() not in [i for i, _f in connection.xrange(keys.DEADLETTERS)]


# -- capdisc mcp re-importing an upstream's changed tools ---------------------------------------

TIDES = "tool:harbour-master.get_tide_tables"


#: (case, the gateway's --import-token is a writer's, it has the keyring, what it logs)
REIMPORTS = [
    ("process-token", False, True, "mcp_upstream_reimport_skipped"),
    ("import-token", True, True, "mcp_upstream_reimported"),
    ("no-keyring", False, False, "mcp_upstream_reimport_refused"),
]


@pytest.mark.parametrize(
    ("import_token", "keyring", "logged"),
    [case[1:] for case in REIMPORTS],
    ids=[case[0] for case in REIMPORTS],
)
def test_mcp_reimports_an_upstream_change_only_with_a_token_that_may_write(
    auth_stack: AuthStack,
    mcp_http: Callable[..., str],
    tmp_path: Path,
    import_token: bool,
    keyring: bool,
    logged: str,
) -> None:
    """The gateway runs as a reader (discover and session, as an MCP host's token). Without an
    import token it says so at start and publishes nothing when the upstream's tools change;
    with ``--import-token`` the change is re-imported; without the keyring it cannot tell, and
    the workers refuse the events (dead-lettered; the gateway logs their reason)."""
    writer = auth_stack.token(grants=["write"])
    harbour = ("--command", f"{sys.executable} {HARBOUR}")
    imported = run_cli(
        "import",
        "mcp",
        *harbour,
        "--tenant",
        TENANT,
        env={**auth_stack.env, "CAPDISC_TOKEN": writer},
    )
    assert imported.returncode == 0, imported.stderr
    connection = redis.Redis.from_url(auth_stack.url)
    version = int(connection.get(keys.version(TENANT)) or 0)
    auth_stack.client(auth_stack.token(), tenant=TENANT).discover("warm up", min_version=version)
    chosen = ("--import-token", writer) if import_token else ()
    url = mcp_http("--tenant", TENANT, "--token", auth_stack.token(), *chosen, keyring=keyring)
    log = tmp_path / "mcp-http.log"
    letters = connection.xlen(keys.DEADLETTERS)

    anyio.run(open_tide_tables, url, auth_stack.token())

    wait_for(lambda: logged in log.read_text(), 30, logged)
    said = log.read_text()
    assert said.count("mcp_upstream_reimport_off") == (1 if keyring and not import_token else 0)
    assert stored(auth_stack, TENANT, TIDES) is import_token
    assert connection.xlen(keys.DEADLETTERS) - letters == (0 if keyring else 1)
    if not import_token:  # said at start and with the change, or by the workers
        assert "lacks the 'write' grant" in said
    if logged == "mcp_upstream_reimport_skipped":
        assert "--import-token" in said and "CAPDISC_MCP_IMPORT_TOKEN" in said


async def open_tide_tables(url: str, token: str) -> None:
    """In an MCP session of ``token``'s holder: bind the harbour's ``open_tide_tables`` and call
    it (the harbour server then tells the gateway its tools changed)."""
    changes = ListChanges()
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    client = MCPClient(streamable_http_client(url, http_client=http), message_handler=changes)
    async with http, client as mcp:
        await bind_harbour(mcp, changes, "open_tide_tables")
        opened = await mcp.call_tool("harbour-master.open_tide_tables", {})
    assert not opened.is_error, text_of(opened)
