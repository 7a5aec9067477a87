"""Each worker serves Prometheus metrics when asked to (``metrics_port``): requests answered by
outcome with their latency, indexing tasks and events by outcome, each tenant's stored and
served index version, queue depth and dead letters; the port is in its heartbeat."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capdisc.client import Client
from capdisc.errors import UnknownTenantError
from capdisc.status import live_workers

from .conftest import DISCOVERY_ARGV, EXAMPLES, INDEXING_ARGV
from .private import PrivateStack, publish_and_serve, wait_for

pytestmark = pytest.mark.timeout(180)
TENANT = "metrics"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[PrivateStack]:
    with PrivateStack(tmp_path, durable=False) as private:
        private.spawn_indexing()
        private.spawn_discovery(CAPDISC_METRICS_PORT="0")
        yield private


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _metrics_port(stack: PrivateStack, kind: str) -> int:
    def found() -> int | None:
        ports = [
            w.get("metrics_port")
            for w in live_workers(stack.connection(), 5.0)
            if w["kind"] == kind
        ]
        return ports[0] if ports and ports[0] else None

    port: int = wait_for(found, 60, f"a {kind} worker's heartbeat naming its metrics port")
    return port


def test_a_discovery_worker_counts_what_it_answers_and_serves(stack: PrivateStack) -> None:
    version = publish_and_serve(stack, EXAMPLES, TENANT)
    client = Client.from_url(stack.url, tenant=TENANT, timeout_s=20)
    fresh = client.discover("refund a stripe payment")
    again = client.discover("refund a stripe payment")  # its vectors cached: no model time
    with pytest.raises(UnknownTenantError):
        client.discover("anything", tenant="nobody-here")

    samples = _samples(_metrics_port(stack, "discovery"))

    assert samples[("capdisc_requests_total", (("op", "discover"), ("outcome", "ok")))] == 2
    assert (
        samples[("capdisc_requests_total", (("op", "discover"), ("outcome", "unknown_tenant")))]
        == 1
    )
    assert samples[("capdisc_request_seconds_count", (("op", "discover"),))] == 3
    assert samples[("capdisc_model_seconds_count", ())] == 1
    assert 0 < fresh.model_ms <= fresh.took_ms and again.model_ms == 0
    assert samples[("capdisc_index_version", (("tenant", TENANT),))] == version
    assert samples[("capdisc_served_version", (("tenant", TENANT),))] == version
    assert samples[("capdisc_redis_up", ())] == 1


def test_an_indexing_worker_serves_its_own_metrics_when_asked(tmp_path: Path) -> None:
    with PrivateStack(tmp_path, durable=False) as private:
        private.env = {**private.env, "CAPDISC_METRICS_PORT": "0"}
        private.spawn_indexing()
        private.spawn_discovery()
        publish_and_serve(private, EXAMPLES, TENANT)

        samples = _samples(_metrics_port(private, "indexing"))

    upserts = samples[("capdisc_events_total", (("decision", "upsert"),))]
    assert upserts >= 98
    assert any(
        name == "capdisc_tasks_total" and dict(labels).get("outcome") == "ok"
        for name, labels in samples
    )
    assert samples[("capdisc_queue_depth", ())] == 0


def test_a_discovery_worker_whose_metrics_port_is_taken_serves_without_metrics(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken, PrivateStack(tmp_path, durable=False) as private:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        private.spawn_indexing()
        worker = private.spawn_discovery(CAPDISC_METRICS_PORT=str(port))
        publish_and_serve(private, EXAMPLES, TENANT)

        answer = Client(private.connection(), tenant=TENANT, timeout_s=20).discover("send an email")

        assert answer.capabilities and worker.poll() is None
        (refused,) = private.events("discovery", "metrics_not_served")
        assert refused["port"] == port and "CAPDISC_METRICS_PORT" in refused["hint"]


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"CAPDISC_METRICS_PORT": "abc"}, "'metrics_port' (env CAPDISC_METRICS_PORT)"),
        (
            {"CAPDISC_EMBEDDER": "openai", "CAPDISC_OPENAI_API_KEY": ""},
            "needs an API key: set CAPDISC_OPENAI_API_KEY",
        ),
        (
            {"CAPDISC_HEARTBEAT_INTERVAL_S": "inf"},
            "'heartbeat_interval_s' (env CAPDISC_HEARTBEAT_INTERVAL_S)",
        ),
    ],
    ids=["malformed setting", "openai without a key", "endless heartbeat"],
)
def test_a_discovery_worker_that_cannot_start_exits_2_with_one_line_saying_why(
    variables: dict[str, str], reason: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | variables

    done = subprocess.run(DISCOVERY_ARGV, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["event"] == "worker_not_started"
    assert reason in record["reason"]


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"CAPDISC_SWEEP_INTERVAL_S": "inf"}, "'sweep_interval_s' (env CAPDISC_SWEEP_INTERVAL_S)"),
    ],
    ids=["endless interval"],
)
def test_an_indexing_worker_that_cannot_start_exits_2_with_one_line_saying_why(
    variables: dict[str, str], reason: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")} | variables

    done = subprocess.run(INDEXING_ARGV, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 2, done.stderr
    (line,) = done.stdout.strip().splitlines() + done.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["event"] == "worker_not_started"
    assert reason in record["reason"]


@pytest.mark.parametrize("argv", [DISCOVERY_ARGV, INDEXING_ARGV], ids=["discovery", "indexing"])
def test_a_worker_warns_of_a_misspelt_variable_in_its_own_log_format(argv: list[str]) -> None:
    """A log shipper reading the worker's JSON lines must not meet a plain-text line first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")} | {
        "CAPDISC_REDIS_URLL": "redis://127.0.0.1:1/0",
        "CAPDISC_HEARTBEAT_INTERVAL_S": "inf",  # stops it right after reading its settings
    }

    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    records = [json.loads(line) for line in (done.stdout + done.stderr).strip().splitlines()]
    (warning,) = [r for r in records if "CAPDISC_REDIS_URLL" in r["event"]]
    assert "CAPDISC_REDIS_URL" in warning["event"].split("did you mean", 1)[1]
    assert records[-1]["event"] == "worker_not_started"
