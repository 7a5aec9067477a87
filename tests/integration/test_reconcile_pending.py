"""The reconciler sends a record's reindex once while it waits: a run that finds the records an
earlier run sent still without a vector (the embedder is down, or they are still queued) sends
nothing again for them, and at most a window of them waits at a time."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from capdisc import keys
from capdisc.redistext import as_str
from capdisc.registry import outbox
from capdisc.registry.events import RegistryEvent
from capdisc_producers.publisher import Publisher
from capdisc_workers.reconciling import keep_backlog

from .conftest import INDEXING_ARGV, publish
from .private import PrivateStack, copy_registry, wait_for
from .test_cli import run_cli
from .test_openai_embedder import Server, indexing_env


@contextmanager
def _every_vector_lost(
    tmp_path: Path, tenant: str, **env: str
) -> Iterator[tuple[PrivateStack, redis.Redis, int]]:
    """A stack whose indexing worker (with ``env``) published the example registry to
    ``tenant``, then lost every vector of it and its embedder (every call answers 503, so the
    reconciler's reindexes wait in the outbox); the stack, a connection and how many
    capabilities are stored."""
    server = Server()
    try:
        with PrivateStack(tmp_path / "stack", durable=False) as private:
            private.spawn(
                "indexing",
                [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"],
                **env,
                **indexing_env(server, max_attempts=5, retry_base_s=60),
            )
            report = publish(private.url, copy_registry(tmp_path / "registry"), tenant, wait_s=90)
            assert report.complete
            connection = private.connection()
            for vectors in connection.scan_iter(match=keys.vectors(tenant, "*")):
                connection.delete(vectors)
            server.script = [(503, {"error": {"message": "overloaded"}}, {})] * 10_000
            yield private, connection, int(connection.hlen(keys.caps(tenant)))
    finally:
        server.close()


def test_a_second_reconcile_does_not_send_again_what_the_first_sent_and_still_waits(
    tmp_path: Path,
) -> None:
    tenant = "repairing"
    with _every_vector_lost(tmp_path, tenant) as (private, connection, stored):
        first = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        second = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)

        waiting = [e for e in outbox.pending_events(connection, tenant) if e.type == "reindex"]
        ids = sorted(c.decode() for c in connection.hkeys(keys.caps(tenant)))

    assert (first["missing_vectors"], second["missing_vectors"]) == (stored, stored)
    assert (first["reindex_sent"], second["reindex_sent"]) == (stored, 0)
    assert sorted(e.capability_id for e in waiting) == ids  # each once


def test_a_large_repair_waits_a_window_at_a_time_and_the_next_run_tops_it_up_only(
    tmp_path: Path,
) -> None:
    tenant = "windowed-repair"
    # a window of one task of 64 events
    with _every_vector_lost(tmp_path, tenant, CAPDISC_PUBLISH_MAX_PENDING_TASKS="1") as (
        private,
        connection,
        stored,
    ):
        first = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        second = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        said = run_cli("reconcile", env=private.env).stdout
        shown = json.loads(run_cli("status", "--json", env=private.env).stdout)

        waiting = [e for e in outbox.pending_events(connection, tenant) if e.type == "reindex"]
        deferred = private.events("indexing", "repair_deferred")

    assert stored > 64
    assert (first["reindex_sent"], first["reindex_deferred"]) == (64, stored - 64)
    assert (second["reindex_sent"], second["reindex_deferred"]) == (0, stored - 64)
    assert len(waiting) == 64 and len({e.capability_id for e in waiting}) == 64
    assert [e["deferred"] for e in deferred] == [stored - 64] * 3
    assert f"{stored - 64} of them wait: a window of repairs" in said
    assert shown["tenants"][tenant]["repair_backlog_tasks"] == -(-(stored - 64) // 64)


@contextmanager
def _vectors_lost_with_a_working_embedder(
    tmp_path: Path, tenant: str, sweep_interval_s: str
) -> Iterator[tuple[PrivateStack, redis.Redis, str, list[str]]]:
    """A stack whose indexing worker (a repair window of one task, no periodic reconcile, a
    sweep every ``sweep_interval_s``, 0: none) published the example registry to ``tenant``,
    then lost every vector of it; the stack, a connection, the vectors' key and the ids."""
    with PrivateStack(tmp_path / "stack", durable=False) as private:
        private.spawn(
            "indexing",
            [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"],
            CAPDISC_PUBLISH_MAX_PENDING_TASKS="1",
            CAPDISC_RECONCILE_INTERVAL_S="0",
            CAPDISC_SWEEP_INTERVAL_S=sweep_interval_s,
        )
        assert publish(private.url, copy_registry(tmp_path / "registry"), tenant, wait_s=90)
        connection = private.connection()
        (vectors,) = connection.scan_iter(match=keys.vectors(tenant, "*"))
        ids = sorted(as_str(i) for i in connection.hkeys(vectors))
        connection.delete(vectors)
        yield private, connection, as_str(vectors), ids


def test_each_repair_task_done_sends_the_next_of_the_backlog_with_no_second_run_or_sweep(
    tmp_path: Path,
) -> None:
    tenant = "chained-repair"
    with _vectors_lost_with_a_working_embedder(tmp_path, tenant, "0") as (
        private,
        connection,
        vectors,
        ids,
    ):
        run = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        wait_for(lambda: connection.hlen(vectors) == len(ids), 60, "every vector embedded again")
        topped = private.events("indexing", "repair_topped_up")

        assert (run["reindex_sent"], run["reindex_deferred"]) == (64, len(ids) - 64)
        assert sum(e["sent"] for e in topped) == len(ids) - 64
        assert not connection.exists(keys.repair_backlog(tenant))


def test_a_repair_task_delivered_twice_sends_the_next_of_the_backlog_once(
    tmp_path: Path,
) -> None:
    tenant = "redelivered-repair"
    with _vectors_lost_with_a_working_embedder(tmp_path, tenant, "0") as (
        private,
        connection,
        vectors,
        ids,
    ):
        keep_backlog(connection, tenant, ids[2:])  # two tasks' worth
        payloads = [
            RegistryEvent("reindex", tenant, cap_id, 1, source="reconciler").encode()
            for cap_id in ids[:2]
        ]
        task_id, publisher = uuid.uuid4().hex, Publisher(private.url)
        try:  # the same task twice, as a worker that died before acknowledging it leaves it
            for _ in range(2):
                outbox.send(
                    connection, publisher.app, keys.TASK_APPLY_EVENTS, [payloads], None, task_id
                )
        finally:
            publisher.close()

        wait_for(lambda: connection.hlen(vectors) == len(ids), 60, "every vector embedded again")
        continued = [e["after_task"] for e in private.events("indexing", "repair_topped_up")]

        assert continued.count(task_id) == 1
        assert len(continued) == len(set(continued))  # each task sent its successor once
        assert not connection.exists(keys.repair_backlog(tenant))


def test_the_sweep_sends_a_backlog_no_repair_task_is_left_to_continue(tmp_path: Path) -> None:
    tenant = "swept-repair"
    with _vectors_lost_with_a_working_embedder(tmp_path, tenant, "1") as (
        _private,
        connection,
        vectors,
        ids,
    ):
        keep_backlog(connection, tenant, ids)  # as a run leaves it, with nothing sent

        wait_for(lambda: connection.hlen(vectors) == len(ids), 60, "every vector embedded again")


def test_a_damaged_backlog_entry_is_passed_over_and_the_rest_still_repaired(
    tmp_path: Path,
) -> None:
    tenant = "damaged-backlog"
    with _vectors_lost_with_a_working_embedder(tmp_path, tenant, "1") as (
        private,
        connection,
        vectors,
        ids,
    ):
        keep_backlog(connection, tenant, ids)
        connection.lpush(keys.repair_backlog(tenant), b"not json")

        wait_for(lambda: connection.hlen(vectors) == len(ids), 60, "every vector embedded again")
        dropped = private.events("indexing", "repair_backlog_entry_dropped")

        assert [e["tenant"] for e in dropped] == [tenant]
        assert private.processes["indexing"].poll() is None
        assert not private.events("indexing", "sweep_failed")
