"""Syncs of one source from processes that share nothing but Redis: each plans against what
the others sent and the workers have not applied yet, and they plan one after the other."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import redis
import yaml
from structlog.testing import capture_logs

from capdisc import keys
from capdisc.registry import outbox
from capdisc_producers.sync import SyncReport, one_sync_at_a_time

from .conftest import Stack, publish, wait_for
from .private import PrivateStack


def add_manifest(registry: Path, name: str) -> Path:
    directory = registry / "scratch" / name
    directory.mkdir(parents=True)
    slack = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    data = yaml.safe_load(slack.read_text())
    data["id"] = f"tool:{name}"
    (directory / "CAPABILITY.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return directory


def test_a_manifest_removed_before_another_syncs_upsert_is_applied_is_deleted(
    tmp_path: Path, registry: Path
) -> None:
    added = add_manifest(registry, "short-lived")
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker yet
        connection = private.connection()
        first = publish(private.url, registry, "pair", wait_s=0)
        assert "tool:short-lived" in [c.id for c in first.plan.upserts]
        shutil.rmtree(added)

        second = publish(private.url, registry, "pair", wait_s=0)

        assert second.plan.deletes == ["tool:short-lived"]
        assert second.plan.upserts == [] and second.sent == 1  # the rest: sent, not again
        private.spawn_indexing()
        wait_for(
            lambda: (
                connection.hexists(keys.tombstones("pair"), "tool:short-lived")
                and connection.hlen(keys.caps("pair")) == len(first.plan.upserts) - 1
            ),
            60,
            "both syncs applied",
        )
        assert not connection.hexists(keys.caps("pair"), "tool:short-lived")


def test_a_waiting_sync_that_counted_another_syncs_events_as_held_waits_for_them_too(
    tmp_path: Path, registry: Path
) -> None:
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker yet
        connection = private.connection()
        first = publish(private.url, registry, "pair", wait_s=0)
        waited: list[SyncReport] = []
        second = threading.Thread(
            target=lambda: waited.append(publish(private.url, registry, "pair", wait_s=60))
        )
        second.start()
        private.spawn_indexing()
        second.join(90)
        stored_when_done = connection.hlen(keys.caps("pair"))

    assert waited and waited[0].sent == 0
    assert (waited[0].earlier_sent, waited[0].earlier_unapplied) == (first.sent, 0)
    assert stored_when_done == len(first.plan.upserts)


def test_a_sync_waiting_for_another_syncs_events_no_worker_applies_says_how_many(
    tmp_path: Path, registry: Path
) -> None:
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker
        first = publish(private.url, registry, "pair", wait_s=0)

        second = publish(private.url, registry, "pair", wait_s=0.5)

    assert second.sent == 0 and second.earlier_unapplied == first.sent > 0


def test_a_sync_waits_while_another_sync_of_its_source_plans_and_sends(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    held, release, reports = threading.Event(), threading.Event(), []

    def another_sync() -> None:
        with one_sync_at_a_time(redis.Redis.from_url(stack.url), tenant, str(registry.resolve())):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=another_sync)
    holder.start()
    assert held.wait(10)
    waiting = threading.Thread(
        target=lambda: reports.append(publish(stack.url, registry, tenant, wait_s=0))
    )
    waiting.start()
    waiting.join(timeout=1.0)

    assert waiting.is_alive() and outbox.pending_events(connection, tenant) == []
    release.set()
    waiting.join(30)
    holder.join(10)
    assert reports and reports[0].sent == len(list(registry.rglob("CAPABILITY.yaml")))


def test_a_lock_left_by_a_sync_that_died_delays_the_next_and_is_said(
    connection: redis.Redis, tenant: str
) -> None:
    connection.set(keys.sync_lock(tenant, "/gone"), "a killed process", px=60_000)
    ran = []

    with capture_logs() as logs, one_sync_at_a_time(connection, tenant, "/gone", wait_s=0.2):
        ran.append(True)

    assert ran
    assert [e["event"] for e in logs] == ["sync_lock_busy"]
    assert connection.get(keys.sync_lock(tenant, "/gone")) == b"a killed process"


def test_a_sync_run_again_by_its_owner_takes_back_the_lock_an_outage_left(
    connection: redis.Redis, tenant: str
) -> None:
    connection.set(keys.sync_lock(tenant, "/reg"), "watcher-1", px=60_000)  # left mid-sync

    with (
        capture_logs() as logs,
        one_sync_at_a_time(connection, tenant, "/reg", owner="watcher-1", wait_s=30),
    ):
        holder = connection.get(keys.sync_lock(tenant, "/reg"))

    assert holder == b"watcher-1" and logs == []
    assert connection.get(keys.sync_lock(tenant, "/reg")) is None  # released after
