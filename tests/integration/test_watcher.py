"""The watcher: edits, editor save patterns, additions and removals reach the running worker."""

from __future__ import annotations

import os
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from structlog.testing import capture_logs

from capdisc import keys
from capdisc.client import Client
from capdisc_producers.publisher import wait_for_acks
from capdisc_producers.sync import SyncReport

from .conftest import Stack, wait_for
from .private import PrivateStack, watcher_running


class Watching:
    """A watcher thread on a registry, with its sync reports on a queue."""

    def __init__(self, connection: redis.Redis, reports: queue.Queue[SyncReport]) -> None:
        self.connection = connection
        self.reports = reports

    def next_applied(self) -> SyncReport:
        """The next sync that sent something, once the indexing worker applied all of it."""
        while True:
            report = self.reports.get(timeout=30)
            if report.sent:
                report.outcomes = wait_for_acks(self.connection, report.batch_id, report.sent, 30)
                assert report.complete
                return report


@pytest.fixture
def watching(
    stack: Stack, connection: redis.Redis, registry: Path, tenant: str
) -> Iterator[Watching]:
    reports: queue.Queue[SyncReport] = queue.Queue()
    with watcher_running(stack.url, registry, tenant, on_sync=reports.put):
        yield Watching(connection, reports)


def _edit(source: Path, target: Path, **changes: object) -> None:
    data = yaml.safe_load(source.read_text())
    data.update(changes)
    target.write_text(yaml.safe_dump(data, sort_keys=False))


def _slack(registry: Path) -> Path:
    return next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))


def test_watcher_publishes_the_registry_when_it_starts(
    watching: Watching, client: Client, registry: Path
) -> None:
    report = watching.next_applied()

    answer = client.discover("post a message to slack", min_version=report.index_version)

    assert len(report.plan.upserts) == len(list(registry.rglob("CAPABILITY.yaml")))
    assert "tool:slack-post-message" in answer.ids


def test_watcher_serves_an_edit_in_place(
    watching: Watching, client: Client, registry: Path
) -> None:
    watching.next_applied()
    _edit(_slack(registry), _slack(registry), version="9.9.9")

    report = watching.next_applied()
    answer = client.discover("post a message to slack", min_version=report.index_version)

    assert [c.id for c in report.plan.upserts] == ["tool:slack-post-message"]
    assert answer.index_version == report.index_version


def test_watcher_follows_a_save_by_rename_over(watching: Watching, registry: Path) -> None:
    watching.next_applied()
    path = _slack(registry)
    temp = path.with_name(".CAPABILITY.yaml.swp")
    _edit(path, temp, version="7.0.0")
    os.replace(temp, path)

    report = watching.next_applied()

    assert [(c.id, c.version) for c in report.plan.upserts] == [
        ("tool:slack-post-message", "7.0.0")
    ]


def test_watcher_publishes_an_added_directory_and_deletes_a_removed_one(
    watching: Watching, client: Client, registry: Path
) -> None:
    watching.next_applied()
    shutil.rmtree(_slack(registry).parent)
    added = registry / "new" / "quokka-counter"
    added.mkdir(parents=True)
    (added / "CAPABILITY.yaml").write_text(
        "name: quokka-counter\nkind: tool\ndescription: Counts quokkas on Rottnest island.\n"
    )

    report = watching.next_applied()
    while len(report.plan.upserts) + len(report.plan.deletes) < 2:
        report = watching.next_applied()
    answer = client.discover(
        "count quokkas on rottnest island", min_version=report.index_version, limit=20
    )

    assert answer.ids[0] == "tool:quokka-counter"
    assert "tool:slack-post-message" not in answer.ids


@pytest.mark.parametrize("how", ["renamed", "deleted", "replaced by a file"])
def test_watcher_keeps_the_registry_when_its_directory_goes_and_syncs_it_when_back(
    watching: Watching, connection: redis.Redis, registry: Path, tenant: str, how: str
) -> None:
    count = len(watching.next_applied().plan.upserts)
    aside = registry.with_name("registry.aside")
    with capture_logs() as logs:
        if how == "deleted":
            shutil.copytree(registry, aside)
            shutil.rmtree(registry)
        else:
            registry.rename(aside)
        if how == "replaced by a file":
            registry.write_text("not a registry")
        wait_for(
            lambda: "registry_dir_missing" in [e["event"] for e in logs],
            30,
            "the watcher noticing its directory is gone",
        )
        assert connection.hlen(keys.caps(tenant)) == count
        assert watching.reports.empty()  # nothing synced, so nothing deleted

        if registry.is_file():
            registry.unlink()
        aside.rename(registry)
        _edit(_slack(registry), _slack(registry), version="8.0.0")
        report = watching.next_applied()

    assert [c.id for c in report.plan.upserts] == ["tool:slack-post-message"]
    assert not report.plan.deletes
    assert connection.hlen(keys.caps(tenant)) == count


def test_watcher_waits_out_a_redis_that_refuses_writes_then_syncs(
    tmp_path: Path, registry: Path
) -> None:
    reports: queue.Queue[SyncReport] = queue.Queue()
    with PrivateStack(tmp_path / "private", durable=False) as private, capture_logs() as logs:
        connection = private.connection()
        connection.config_set("maxmemory", 1)  # full: every write is refused (noeviction)
        with watcher_running(private.url, registry, "full", on_sync=reports.put) as watcher:
            wait_for(
                lambda: "redis_refuses_writes" in [e["event"] for e in logs],
                30,
                "the watcher noticing Redis refuses writes",
            )
            assert reports.empty() and watcher.is_alive()
            connection.config_set("maxmemory", 0)
            report = reports.get(timeout=30)

    assert report.sent == len(report.plan.upserts) > 0


def test_a_manifest_added_and_removed_before_its_upsert_is_applied_is_deleted(
    tmp_path: Path, registry: Path
) -> None:
    reports: queue.Queue[SyncReport] = queue.Queue()
    added = registry / "scratch" / "short-lived"
    with PrivateStack(tmp_path / "private", durable=False) as private:  # no indexing worker yet
        connection = private.connection()
        with watcher_running(private.url, registry, "brief", on_sync=reports.put):
            reports.get(timeout=30)  # the registry published, not applied
            added.mkdir(parents=True)
            _edit(_slack(registry), added / "CAPABILITY.yaml", id="tool:short-lived")
            assert "tool:short-lived" in [c.id for c in reports.get(timeout=30).plan.upserts]
            shutil.rmtree(added)
            removed = reports.get(timeout=30)
            assert removed.plan.deletes == ["tool:short-lived"]
            private.spawn_indexing()
            wait_for(
                lambda: connection.hexists(keys.tombstones("brief"), "tool:short-lived"),
                60,
                "the delete applied",
            )
            assert not connection.hexists(keys.caps("brief"), "tool:short-lived")
