"""The one tenant-name rule (capdisc.tenants), and every edge that applies it agreeing on it."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner

from capdisc.client import Client
from capdisc.discovery.protocol import DiscoverRequest, SessionRequest
from capdisc.errors import ConfigError, EventDecodeError, TenantNameError
from capdisc.registry.events import RegistryEvent
from capdisc.settings import Settings
from capdisc.tenants import TENANT_RULE, check_tenant, is_tenant, tenant_problem
from capdisc_producers.cli import cli

GOOD = [
    pytest.param("default", id="default"),
    pytest.param("bench", id="bench"),
    pytest.param("warmup", id="warmup"),
    pytest.param("reliability", id="reliability"),
    pytest.param("acme", id="acme"),
    pytest.param("t-0123456789ab", id="test-tenant"),
    pytest.param("Acme", id="capitals"),
    pytest.param("a", id="one-char"),
    pytest.param("7", id="one-digit"),
    pytest.param("a_b-c", id="underscore-dash"),
    pytest.param("a" * 64, id="64-chars"),
]
BAD = [
    pytest.param("", id="empty"),
    pytest.param("../x", id="path-traversal"),
    pytest.param("*", id="glob"),
    pytest.param("a:b", id="key-separator"),
    pytest.param("a" * 10_240, id="10kb"),
    pytest.param("a" * 65, id="65-chars"),
    pytest.param("-acme", id="leading-dash"),
    pytest.param("_acme", id="leading-underscore"),
    pytest.param("acme corp", id="space"),
    pytest.param("acme\n", id="trailing-newline"),
    pytest.param("a.b", id="dot"),
    pytest.param("a/b", id="slash"),
    pytest.param("caf\u00e9", id="non-ascii-letter"),
    pytest.param("\uff41cme", id="fullwidth-letter"),
    pytest.param("a\x00", id="nul"),
    pytest.param("t\udcff", id="lone-surrogate"),
]


@pytest.mark.parametrize("name", GOOD)
def test_a_good_name_passes_unchanged(name: str) -> None:
    assert check_tenant(name, "--tenant") == name
    assert is_tenant(name) and tenant_problem(name) is None


@pytest.mark.parametrize("name", BAD)
def test_a_bad_name_is_refused_saying_what_is_allowed_and_where_it_came_from(name: str) -> None:
    with pytest.raises(TenantNameError) as refused:
        check_tenant(name, "--tenant")

    message = str(refused.value)
    assert message.startswith("--tenant ") and TENANT_RULE in message
    assert len(message) < 300  # the name is quoted shortened, whatever its size
    assert not is_tenant(name)


def test_a_long_name_is_quoted_shortened_with_its_length() -> None:
    with pytest.raises(TenantNameError, match=r"\.\.\. \(10240 characters\) is not a valid"):
        check_tenant("a" * 10_240, "tenant")


@pytest.mark.parametrize("name", [None, 5, b"acme"])
def test_a_name_that_is_not_text_is_refused(name: Any) -> None:
    with pytest.raises(TenantNameError, match="not text"):
        check_tenant(name)


# -- every edge applies the same rule --------------------------------------------------------------


def _event(tenant: str) -> str:
    return json.dumps(
        {
            "type": "delete",
            "tenant": tenant,
            "capability_id": "tool:a",
            "seq": 1,
            "event_id": "e1",
            "occurred_at_ms": 1,
            "schema_version": 1,
        },
        ensure_ascii=False,
    )


def _edges_accept(name: str) -> dict[str, bool]:
    """Whether each edge accepts ``name`` as a tenant (without sending or writing anything)."""
    accepted = {}
    attempts = {
        "event decode": lambda: RegistryEvent.decode(_event(name)),
        "discover request decode": lambda: DiscoverRequest.decode(
            json.dumps({"query": "q", "request_id": "r-1", "tenant": name})
        ),
        "session request decode": lambda: SessionRequest.decode(
            json.dumps({"op": "show", "session": "s", "request_id": "r-1", "tenant": name})
        ),
        "settings": lambda: Settings.load({"CAPDISC_TENANT": name}),
        "client": lambda: Client(redis.Redis(), tenant=name),
    }
    for edge, attempt in attempts.items():
        try:
            attempt()
        except (EventDecodeError, ConfigError, TenantNameError, UnicodeEncodeError):
            accepted[edge] = False
        else:
            accepted[edge] = True
    return accepted


@pytest.mark.parametrize("name", [*GOOD, *BAD])
def test_every_edge_agrees_with_the_rule(name: str) -> None:
    expected = dict.fromkeys(_edges_accept("default"), is_tenant(name))
    if name == "":
        expected["client"] = True  # Client(tenant="") means no tenant given: its default

    assert _edges_accept(name) == expected


@pytest.mark.parametrize("name", ["../x", "*", "a:b", "a" * 10_240])
def test_the_cli_refuses_a_bad_tenant_as_a_usage_error_before_connecting(name: str) -> None:
    result = CliRunner().invoke(
        cli, ["discover", "anything", "--tenant", name, "--redis-url", "redis://127.0.0.1:1/0"]
    )

    assert result.exit_code == 2
    assert "Invalid value for '--tenant'" in result.output and TENANT_RULE in result.output


def test_every_tenant_option_of_the_cli_is_checked() -> None:
    unchecked = []

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if "--tenant" in getattr(param, "opts", []) and param.callback is None:
                unchecked.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            if name != "token":  # `token issue --tenant '*'` issues an all-tenant admin token
                walk(sub, f"{path} {name}")

    walk(cli, "capdisc")

    assert unchecked == []
