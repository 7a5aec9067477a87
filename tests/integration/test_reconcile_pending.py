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
from capdisc.registry import outbox

from .conftest import INDEXING_ARGV, publish
from .private import PrivateStack, copy_registry
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

        waiting = [e for e in outbox.pending_events(connection, tenant) if e.type == "reindex"]
        deferred = private.events("indexing", "repair_deferred")

    assert stored > 64
    assert (first["reindex_sent"], first["reindex_deferred"]) == (64, stored - 64)
    assert (second["reindex_sent"], second["reindex_deferred"]) == (0, stored - 64)
    assert len(waiting) == 64 and len({e.capability_id for e in waiting}) == 64
    assert [e["deferred"] for e in deferred] == [stored - 64] * 3
    assert f"{stored - 64} of them wait for the next runs" in said
