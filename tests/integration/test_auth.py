"""Who asks is proven: real workers with auth on, asked through every front door (the Client,
the CLI, capdisc mcp over stdio and over streamable HTTP) with missing, forged, expired and
wrong-tenant tokens (a clear error, no data), and with valid tokens whose roles decide exactly
what is seen."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from capdisc import auth, keys
from capdisc.access import Caller, visible
from capdisc.client import Client
from capdisc.errors import AuthError, ForbiddenError
from capdisc.models import Visibility
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, sync_directory

from .conftest import EXAMPLES, MAX_BYTES
from .private import PrivateStack
from .test_cli import run_cli

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

    def token(self, tenant: str = TENANT, *, keyring: auth.Keyring | None = None,
              now: float | None = None, **fields: Any) -> str:
        fields.setdefault("grants", ["discover", "session"])
        fields.setdefault("ttl_s", 600)
        return auth.issue(keyring or self.keyring, tenant=tenant,
                          now=time.time() if now is None else now, **fields)

    def client(self, token: str | None, **kwargs: Any) -> Client:
        return Client(redis.Redis.from_url(self.url), token=token, timeout_s=20, **kwargs)


def bad_tokens(stack: AuthStack) -> dict[str, tuple[str | None, type[AuthError], str]]:
    """Tokens every front door refuses: the token, the error and what its message says."""
    impostor = auth.Keyring.from_mapping({stack.keyring.kids[-1]: "x" * 48})
    return {
        "missing": (None, AuthError, "no identity token"),
        "forged": (stack.token(keyring=impostor), AuthError, "does not verify"),
        "unknown-key": (stack.token(keyring=auth.Keyring.from_mapping({"k0": "y" * 48})),
                        AuthError, "does not have"),
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
        return sync_directory(redis.Redis.from_url(url), publisher, registry, tenant=tenant,
                              max_bytes=MAX_BYTES, wait_s=90)
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
            "warm up", min_version=report.index_version)
        yield stack


# -- the Client -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "forged", "unknown-key", "expired",
                                  "wrong-tenant"])
def test_client_refused_tokens_get_a_clear_error_and_no_data(auth_stack: AuthStack,
                                                             case: str) -> None:
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
        auth_stack: AuthStack) -> None:
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


IDENTITIES = [
    pytest.param((), None, id="anonymous"), pytest.param(("finance",), None, id="finance"),
    pytest.param(("eng",), None, id="eng"), pytest.param(("billing", "eng"), None, id="two"),
    pytest.param((), "alice", id="alice"), pytest.param(("support",), "bob", id="bob"),
]
QUERIES = ["refund a stripe payment", "create an invoice for a customer",
           "open a pull request", "post a message to the team's slack channel",
           "send an email", "finance", "tell bob the deploy is done"]


@pytest.mark.parametrize(("roles", "user"), IDENTITIES)
def test_no_answer_shows_a_token_holder_what_its_roles_may_not_see(
        auth_stack: AuthStack, roles: tuple[str, ...], user: str | None) -> None:
    client = auth_stack.client(auth_stack.token(roles=list(roles), user=user))
    caller = Caller.of(roles, user)
    hidden = {f"tool:{name}" for name, v in RESTRICTED.items()
              if not visible(Visibility(tuple(v.get("roles", ())), tuple(v.get("users", ()))),
                             caller)}
    session = f"leak-{'-'.join(roles) or 'none'}-{user or 'none'}"

    for query in QUERIES:
        answer = client.discover(query, tool_format="mcp", session=session,
                                 options={"tier1_min_relevance": -1.0, "tier1_top_k": 20})
        shown = set(answer.ids) | set(answer.tool_names.values()) | set(answer.session["bound"])
        assert not shown & hidden, (query, shown & hidden)
        tier0 = answer.raw["tiers"]["tier0"]  # lists names by category
        assert not any(name.split(":")[1] in tier0 for name in hidden), query
    assert not {b["id"] for b in client.working_set(session)["bound"]} & hidden


def test_refusals_are_logged_with_kid_and_subject_never_the_token(
        auth_stack: AuthStack) -> None:
    forged, _error, _says = bad_tokens(auth_stack)["forged"]
    with pytest.raises(AuthError):
        auth_stack.client(forged).discover("refund a stripe payment")

    refused = auth_stack.private.events("discovery", "request_refused")
    log_text = (auth_stack.private.log_dir / "discovery.log").read_text()
    assert any(r["reason"] == "forged" and r["kid"] == auth_stack.keyring.kids[-1]
               and r["subject"] == f"anonymous@{TENANT}" for r in refused)
    assert forged not in log_text and forged.split(".")[2] not in log_text


def test_a_dead_lettered_request_keeps_no_token(auth_stack: AuthStack) -> None:
    connection = redis.Redis.from_url(auth_stack.url)
    presented = auth_stack.token()
    payload = json.dumps({"query": "x", "token": presented, "bogus": 1})  # no request id
    connection.xadd(keys.DISCOVERY_REQUESTS, {"payload": payload})

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        letters = [f for _i, f in connection.xrange(keys.DEADLETTERS)
                   if b"bogus" in f.get(b"payload", b"")]
        if letters:
            break
        time.sleep(0.05)
    assert letters, "the request was not dead-lettered"
    assert presented.encode() not in letters[0][b"payload"]
    assert b"[redacted]" in letters[0][b"payload"]


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "forged", "expired", "wrong-tenant"])
def test_cli_refused_tokens_get_a_clear_error_and_no_data(auth_stack: AuthStack,
                                                          case: str) -> None:
    presented, _error, says = bad_tokens(auth_stack)[case]
    env = {**auth_stack.env, **({"CAPDISC_TOKEN": presented} if presented else {})}

    found = run_cli("discover", "refund a stripe payment", "--tenant", TENANT, "--json",
                    env=env)
    shown = run_cli("session", "show", "auth-s1", "--tenant", TENANT, env=env)

    for result in (found, shown):
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert says in result.stderr
        assert not presented or presented not in result.stderr


def test_cli_token_flag_and_variable_prove_roles(auth_stack: AuthStack) -> None:
    finance = auth_stack.token(roles=["finance"])

    by_flag = run_cli("discover", "refund a stripe payment", "--json", "--token", finance,
                      env=auth_stack.env)
    by_variable = run_cli("discover", "refund a stripe payment", "--json",
                          env={**auth_stack.env, "CAPDISC_TOKEN": auth_stack.token()})

    assert json.loads(by_flag.stdout)["capabilities"][0]["id"] == REFUND
    assert REFUND not in [c["id"] for c in json.loads(by_variable.stdout)["capabilities"]]


def test_cli_token_issue_makes_tokens_the_workers_accept(auth_stack: AuthStack) -> None:
    issued = run_cli("token", "issue", "--tenant", TENANT, "--roles", "finance", "--ttl", "5m",
                     "--keys", str(auth_stack.keys_file), env=auth_stack.env)
    assert issued.returncode == 0, issued.stderr

    identity = auth.verify(issued.stdout.strip(), auth_stack.keyring, time.time())
    answer = auth_stack.client(issued.stdout.strip()).discover("refund a stripe payment")

    assert identity.roles == ("finance",) and identity.expires_at - identity.issued_at == 300
    assert answer.ids[0] == REFUND
