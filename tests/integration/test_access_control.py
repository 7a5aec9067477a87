"""Access control through the real workers and the CLI: a capability restricted to a role is
found by that role only, in answers, tool definitions, Tier 0 and session working sets."""

from __future__ import annotations

import json
from pathlib import Path

import redis
import yaml

from capdisc.client import Client
from capdisc.registry.store import tenant_version

from .conftest import Stack, publish
from .test_cli import run_cli

REFUND = "tool:stripe-refund"


def _restrict(registry: Path, roles: list[str]) -> None:
    path = next(registry.glob("*/stripe-refund/CAPABILITY.yaml"))
    data = yaml.safe_load(path.read_text())
    data["visibility"] = {"roles": roles}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_restricted_capability_is_found_only_by_its_role(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    _restrict(registry, ["finance"])
    report = publish(stack.url, registry, tenant)
    anonymous = Client(connection, tenant=tenant, timeout_s=20)
    finance = Client(connection, tenant=tenant, timeout_s=20, roles=["finance"])

    hidden = anonymous.discover(
        "refund a stripe payment", tool_format="openai-chat", min_version=report.index_version
    )
    shown = finance.discover("refund a stripe payment", tool_format="openai-chat")

    assert REFUND not in hidden.ids and REFUND not in hidden.tool_names.values()
    assert "stripe-refund" not in hidden.raw["tiers"]["tier0"]
    assert shown.ids[0] == REFUND and REFUND in shown.tool_names.values()


def test_a_session_shows_only_what_its_caller_may_see(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    _restrict(registry, ["finance"])
    report = publish(stack.url, registry, tenant)
    finance = Client(connection, tenant=tenant, timeout_s=20, roles=["finance"])
    finance.discover("refund a stripe payment", session="s1", min_version=report.index_version)

    mine = finance.working_set("s1")
    theirs = Client(connection, tenant=tenant, timeout_s=20).working_set("s1")

    assert REFUND in [b["id"] for b in mine["bound"]]
    assert REFUND not in [b["id"] for b in theirs["bound"]]


def test_cli_publish_and_discover_take_roles_and_user(
    stack: Stack, registry: Path, tenant: str
) -> None:
    published = run_cli(
        "publish", str(registry), "--tenant", tenant, "--user", "alice", env=stack.env
    )
    version = str(tenant_version(stack.connection(), tenant))
    as_bob = run_cli(
        "discover",
        "refund a stripe payment",
        "--json",
        "--tenant",
        tenant,
        "--user",
        "bob",
        "--min-version",
        version,
        env=stack.env,
    )
    as_alice = run_cli(
        "discover",
        "refund a stripe payment",
        "--json",
        "--tenant",
        tenant,
        "--user",
        "alice",
        "--min-version",
        version,
        env=stack.env,
    )

    assert published.returncode == 0, published.stderr
    assert json.loads(as_bob.stdout)["capabilities"] == []
    assert json.loads(as_alice.stdout)["capabilities"][0]["id"] == REFUND
