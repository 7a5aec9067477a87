"""Workers whose host clocks are an hour off serve and count as live: every time one process
writes and another compares (a request's deadline, a heartbeat, a delivery) is on Redis's
clock. Each worker's clock is shifted with libfaketime, preloaded into it alone."""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.identity import auth
from capdisc.status import live_workers

from .conftest import INDEXING_ARGV, Stack, publish
from .private import PrivateStack, copy_registry, publish_and_serve, write_catalog
from .test_auth import publish_as
from .test_cli import run_cli
from .test_healing import CONVERGE_S, await_condition, start_import, stored

TENANT = "skewed"


def shifted_clock(offset: str) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``offset`` from the host's
    (``+1h``, ``-1h``); its monotonic clock is left alone."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or not spec.submodule_search_locations or sys.platform != "linux":
        pytest.skip("shifting a worker's clock needs libfaketime (a dev dependency) on Linux")
    package = Path(next(iter(spec.submodule_search_locations)))
    return {
        "LD_PRELOAD": str(package / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """An indexing worker an hour behind and a discovery worker an hour ahead, serving the
    example registry."""
    behind, ahead = shifted_clock("-1h"), shifted_clock("+1h")
    base = tmp_path_factory.mktemp("skewed")
    stack = PrivateStack(base, durable=False)
    try:
        stack.spawn("indexing", [*INDEXING_ARGV, "-n", "indexing-behind@%h"], **behind)
        stack.spawn_discovery(**ahead)
        publish_and_serve(stack, copy_registry(base / "registry"), TENANT)
        yield stack
    finally:
        stack.close()


def test_a_discovery_worker_an_hour_ahead_answers_a_client_on_time(skewed: PrivateStack) -> None:
    with Client(skewed.connection(), tenant=TENANT, timeout_s=10) as client:
        answer = client.discover("post a message to a slack channel")

    assert answer.capabilities


def test_workers_an_hour_off_are_listed_live(skewed: PrivateStack) -> None:
    connection = skewed.connection()

    kinds = {w["kind"] for w in live_workers(connection)}

    assert kinds == {"indexing", "discovery"}


@pytest.fixture(scope="module")
def skewed_with_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """Auth on, an indexing worker and a discovery worker an hour behind the host that issues
    the tokens (whose clock is Redis's)."""
    behind = shifted_clock("-1h")
    base = tmp_path_factory.mktemp("skewed-auth")
    keys_file = base / "secrets" / "auth_keys.json"
    auth.save_keyring(keys_file, auth.Keyring([auth.new_key(time.time())]))
    stack = PrivateStack(base, durable=False)
    try:
        stack.env.update(CAPDISC_AUTH="on", CAPDISC_AUTH_KEYS_FILE=str(keys_file))
        stack.spawn("indexing", [*INDEXING_ARGV, "-n", "indexing-behind@%h"], **behind)
        stack.spawn_discovery(**behind)
        yield stack
    finally:
        stack.close()


def _token_issued_now(stack: PrivateStack, grants: list[str]) -> str:
    keyring = auth.load_keyring(Path(stack.env["CAPDISC_AUTH_KEYS_FILE"]))
    return auth.issue(keyring, tenant=TENANT, grants=grants, ttl_s=900, now=time.time())


def test_an_indexing_worker_an_hour_behind_applies_an_event_whose_token_was_issued_now(
    skewed_with_auth: PrivateStack, tmp_path: Path
) -> None:
    registry = copy_registry(tmp_path / "registry", lambda p: p.name == "slack-post-message")

    report = publish_as(
        skewed_with_auth.url, registry, TENANT, _token_issued_now(skewed_with_auth, ["write"])
    )

    assert [o.get("reason") for o in report.outcomes if o.get("decision") == "rejected"] == []
    assert report.complete and report.index_version > 0


def test_a_discovery_worker_an_hour_behind_answers_a_token_issued_now(
    skewed_with_auth: PrivateStack, tmp_path: Path
) -> None:
    writer = _token_issued_now(skewed_with_auth, ["admin"])
    registry = copy_registry(tmp_path / "registry", lambda p: p.name == "slack-post-message")
    version = publish_as(skewed_with_auth.url, registry, TENANT, writer).index_version
    token = _token_issued_now(skewed_with_auth, ["discover"])

    with Client(skewed_with_auth.connection(), token=token, timeout_s=20) as client:
        answer = client.discover("post a message to a slack channel", min_version=version)

    assert answer.capabilities


def test_the_tasks_of_a_killed_worker_an_hour_ahead_run_again(tmp_path: Path) -> None:
    ahead = shifted_clock("+1h")
    with PrivateStack(tmp_path, durable=False) as stack:
        connection = stack.connection()
        first = stack.spawn("indexing-ahead", [*INDEXING_ARGV, "-n", "ahead@%h"], **ahead)
        importer = start_import(stack, write_catalog(tmp_path / "tools.jsonl", 600, "skew"))
        await_condition(lambda: connection.hlen(keys.KOMBU_UNACKED) > 0, 60, "a task in flight")

        first.send_signal(signal.SIGKILL)
        first.wait()
        stack.spawn_indexing("indexing-on-time")

        await_condition(lambda: stored(connection) == 600, CONVERGE_S, "convergence")
        assert importer.wait(timeout=120) == 0


def test_a_change_published_from_a_host_an_hour_behind_replaces_what_was_stored_before(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    """Events are ordered by Redis's clock, not their producer's: a host whose clock is an hour
    behind the one that published before it still publishes the newer content."""
    assert publish(stack.url, registry, tenant).complete
    manifest = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    manifest.write_text(
        manifest.read_text().replace("description: >-\n  ", "description: >-\n  Newer. ", 1)
    )

    result = run_cli(
        "publish", str(registry), "--tenant", tenant, env={**stack.env, **shifted_clock("-1h")}
    )

    stored = json.loads(connection.hget(keys.caps(tenant), "tool:slack-post-message") or "{}")
    assert result.returncode == 0, result.stderr
    assert stored["capability"]["description"].startswith("Newer. ")


def test_a_publish_overtaken_by_a_newer_change_says_which_it_did_not_apply(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    """A change the registry already holds a newer one of (sent later by another sync) is not
    applied, and the command says so rather than only "applied"."""
    from capdisc.models import Capability
    from capdisc.registry.events import RegistryEvent
    from capdisc.registry.store import apply_event

    assert publish(stack.url, registry, tenant).complete
    slack = "tool:slack-post-message"
    stored = json.loads(connection.hget(keys.caps(tenant), slack) or "{}")
    newer = Capability.from_dict({**stored["capability"], "description": "Newest of all."})
    event = RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id=slack,
        seq=stored["seq"] + 10**15,  # a sync sent after the one below (in Redis's clock)
        capability=newer.to_dict(),
    )
    space = (connection.get(keys.space(tenant)) or b"hashing-384.fs1").decode()
    apply_event(connection, event, newer, lambda _c: bytes(4 * 384), space)
    manifest = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    manifest.write_text(
        manifest.read_text().replace("description: >-\n  ", "description: >-\n  Older. ", 1)
    )

    result = run_cli("publish", str(registry), "--tenant", tenant, env=stack.env)

    assert result.returncode == 0, result.stderr
    assert "not applied, a newer change of it was applied first" in result.stderr
    assert slack in result.stderr
