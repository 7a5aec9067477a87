"""Snapshots on disk (``snapshot_dir``): a discovery worker writes the index it built; a worker
started later maps it instead of building from Redis, applies the changes made meanwhile, and
refuses (saying which file and why) a snapshot that is corrupt, loading from Redis instead;
``capdisc status`` reports the snapshot each worker last wrote. Each test runs its own Redis and
workers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from capdisc import keys
from capdisc.client import Client
from capdisc.status import collect_status, live_workers
from capdisc_producers.status_cli import _render_status

from .conftest import publish
from .private import PrivateStack, copy_registry, publish_and_serve, wait_for

TENANT = "snap"
SLACK = "tool:slack-post-message"
MANIFEST = Path("communication") / "slack-post-message" / "CAPABILITY.yaml"


def serving_and_written(tmp_path: Path) -> tuple[PrivateStack, Path, dict[str, Any], int]:
    """A stack whose discovery worker (still running) served the example registry and wrote
    its snapshot; the stack, the registry copy, the ``snapshot_written`` event and the version
    written."""
    snapshots = tmp_path / "snapshots"
    stack = PrivateStack(tmp_path, durable=False)
    try:
        stack.spawn_indexing()
        stack.spawn_discovery(
            CAPDISC_SNAPSHOT_DIR=str(snapshots),
            CAPDISC_SNAPSHOT_INTERVAL_S="0",
            CAPDISC_SNAPSHOT_KEEP="1",  # only the newest: no older one to fall back on
        )
        registry = copy_registry(tmp_path / "registry")
        version = publish_and_serve(stack, registry, TENANT)
        written = wait_for(
            lambda: [
                e
                for e in stack.events("discovery", "snapshot_written")
                if e["tenant"] == TENANT and e["index_version"] == version
            ],
            30,
            "the snapshot written",
        )
        return stack, registry, written[0], version
    except BaseException:
        stack.close()
        raise


def served_and_written(tmp_path: Path) -> tuple[PrivateStack, Path, Path, int]:
    """:func:`serving_and_written`, its discovery worker stopped; the stack, the registry copy,
    the snapshot directory and the version written."""
    stack, registry, written, version = serving_and_written(tmp_path)
    try:
        stack.stop_process("discovery")
        return stack, registry, Path(written["path"]), version
    except BaseException:
        stack.close()
        raise


def zebrafish_published(stack: PrivateStack, registry: Path, written: int) -> int:
    """The Slack tool's description changed and published after version ``written``; the new
    index version (the next one)."""
    manifest = registry / MANIFEST
    manifest.write_text(
        manifest.read_text().replace(
            "Posts a message to a Slack channel", "Posts a zebrafish bulletin to a Slack channel"
        )
    )
    changed = publish(stack.url, registry, TENANT, wait_s=60).index_version
    assert changed == written + 1
    return changed


def assert_zebrafish_served(stack: PrivateStack, changed: int) -> None:
    """A turn that waits for version ``changed`` gets it, with the edited Slack tool first."""
    with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
        answer = client.discover("post a zebrafish bulletin", min_version=changed)
    assert answer.index_version == changed and answer.ids[0] == SLACK


def updates(stack: PrivateStack, worker: str) -> list[tuple[int, str]]:
    """The tenant's ``index_updated`` events of ``worker``: each version and how it was
    applied."""
    events = stack.events(worker, "index_updated")
    return [(e["index_version"], e["applied"]) for e in events if e["tenant"] == TENANT]


def updates_to(stack: PrivateStack, worker: str, version: int) -> list[tuple[int, str]]:
    """:func:`updates` once ``worker`` applied ``version`` (the turn that saw it served may
    have been answered by the other worker, still applying it)."""
    wait_for(
        lambda: any(v == version for v, _ in updates(stack, worker)),
        30,
        f"{worker} applying version {version}",
    )
    return updates(stack, worker)


def test_status_reports_the_snapshot_a_worker_wrote_with_its_version(tmp_path: Path) -> None:
    stack, _registry, written, version = serving_and_written(tmp_path)
    with stack, stack.connection() as connection:
        worker = stack.processes["discovery"]

        def reported() -> dict[str, Any] | None:
            for beat in collect_status(connection)["workers"]:
                if beat.get("pid") == worker.pid and TENANT in beat.get("snapshots", {}):
                    return dict(beat["snapshots"][TENANT])
            return None

        snapshot = wait_for(reported, 30, "a heartbeat naming the snapshot written")

        assert snapshot["index_version"] == version
        assert snapshot["megabytes"] == written["megabytes"]
        assert snapshot["took_s"] == written["took_s"]
        assert 0 <= time.time() - snapshot["written_at_unix_s"] < 120
        shown = _render_status(collect_status(connection))
        assert f"snapshot of {TENANT} v{version} written " in shown


def test_a_restarted_worker_serves_its_snapshot_and_the_change_made_while_it_was_down(
    tmp_path: Path,
) -> None:
    stack, registry, path, written = served_and_written(tmp_path)
    with stack:
        changed = zebrafish_published(stack, registry, written)

        worker = stack.spawn_discovery("discovery-2", CAPDISC_SNAPSHOT_DIR=str(path.parents[2]))
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a zebrafish bulletin", min_version=changed)

        assert answer.index_version == changed and answer.ids[0] == SLACK
        assert answer.worker.endswith(f":{worker.pid}")
        loaded = stack.events("discovery-2", "index_loaded_from_snapshot")
        assert [(e["tenant"], e["snapshot_version"], e["index_version"]) for e in loaded] == [
            (TENANT, written, changed)
        ]
        assert loaded[0]["changes_applied"] == 1 and loaded[0]["path"] == str(path)
        assert not [e for e in stack.events("discovery-2", "index_loaded") if e["tenant"] == TENANT]
        assert not stack.events("discovery-2", "snapshot_refused")
        beats = wait_for(
            lambda: [
                w
                for w in live_workers(stack.connection())
                if w.get("pid") == worker.pid and TENANT in w.get("loaded_from", {})
            ],
            30,
            "a heartbeat saying where the tenant was loaded from",
        )
        assert [w["loaded_from"][TENANT] for w in beats] == ["snapshot"]


def test_the_registry_published_again_after_redis_lost_its_data_is_written_to_disk(
    tmp_path: Path,
) -> None:
    stack, registry, written, version = serving_and_written(tmp_path)
    with stack, stack.connection() as connection:
        connection.flushall()  # Redis lost its data: the snapshot on disk is of another epoch
        wait_for(lambda: stack.events("discovery", "redis_data_lost"), 30, "the worker noticing")
        assert publish(stack.url, registry, TENANT, wait_s=60).index_version == version

        again = wait_for(
            lambda: [
                e
                for e in stack.events("discovery", "snapshot_written")
                if e["tenant"] == TENANT and e["path"] != written["path"]
            ],
            30,
            "the index reloaded after the loss written as a snapshot of the new epoch",
        )
        assert again[0]["index_version"] == version


def test_a_corrupt_snapshot_is_refused_by_name_and_the_tenant_loaded_from_redis(
    tmp_path: Path,
) -> None:
    stack, _registry, path, written = served_and_written(tmp_path)
    with stack:
        records = path / "r.table.blob.npy"
        records.write_bytes(records.read_bytes()[:-200])  # a torn file

        stack.spawn_discovery("discovery-2", CAPDISC_SNAPSHOT_DIR=str(path.parents[2]))
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a message to the team's slack channel")

        assert answer.index_version == written and answer.ids[0] == SLACK
        refused = stack.events("discovery-2", "snapshot_refused")
        assert [(e["tenant"], e["path"]) for e in refused] == [(TENANT, str(path))]
        assert "r.table.blob.npy is corrupt" in refused[0]["reason"]
        loaded = [e for e in stack.events("discovery-2", "index_loaded") if e["tenant"] == TENANT]
        assert [e["index_version"] for e in loaded] == [written]
        again = wait_for(
            lambda: stack.events("discovery-2", "snapshot_written"),
            30,
            "the snapshot written again",
        )
        assert [(e["tenant"], e["path"]) for e in again] == [(TENANT, str(path))]

        stack.spawn_discovery("discovery-3", CAPDISC_SNAPSHOT_DIR=str(path.parents[2]))
        mapped = wait_for(
            lambda: stack.events("discovery-3", "index_loaded_from_snapshot"), 60, "a mapped start"
        )
        assert [(e["index_version"], e["path"]) for e in mapped] == [(written, str(path))]
        assert not stack.events("discovery-3", "snapshot_refused")


def test_a_snapshot_older_than_the_changes_stream_reaches_is_refused_and_redis_loaded(
    tmp_path: Path,
) -> None:
    stack, registry, path, written = served_and_written(tmp_path)
    with stack:
        (registry / MANIFEST).unlink()  # a change while the worker is down...
        changed = publish(stack.url, registry, TENANT, wait_s=60).index_version
        assert changed == written + 1
        stack.connection().xtrim(keys.CHANGES, maxlen=0)  # ...then trimmed off the stream

        stack.spawn_discovery("discovery-2", CAPDISC_SNAPSHOT_DIR=str(path.parents[2]))
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a message to slack", min_version=changed)

        assert answer.index_version == changed and SLACK not in answer.ids
        refused = stack.events("discovery-2", "snapshot_refused")
        assert [(e["tenant"], e["path"]) for e in refused] == [(TENANT, str(path))]
        assert "trimmed" in refused[0]["reason"]
        assert not stack.events("discovery-2", "index_loaded_from_snapshot")


def test_a_large_tenant_is_built_by_a_child_process_and_mapped(tmp_path: Path) -> None:
    stack, _registry, _path, written = served_and_written(tmp_path)
    with stack:
        fresh = tmp_path / "fresh-snapshots"  # none to map: the tenant comes from Redis
        stack.spawn_discovery("discovery-2", CAPDISC_SNAPSHOT_DIR=str(fresh), CAPDISC_MAP_ABOVE="1")
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a message to the team's slack channel")

        assert answer.index_version == written and answer.ids[0] == SLACK
        built = stack.events("discovery-2", "index_built_apart")
        assert [(e["tenant"], e["index_version"]) for e in built] == [(TENANT, written)]
        assert built[0]["child_peak_rss_mb"] > 0  # the child said how much it took
        assert not [e for e in stack.events("discovery-2", "index_loaded") if e["tenant"] == TENANT]
        assert list((fresh / TENANT).iterdir())  # the child's snapshot, in its vector space


def test_a_child_build_that_fails_leaves_the_worker_to_build_the_tenant_itself(
    tmp_path: Path,
) -> None:
    stack, _registry, _path, written = served_and_written(tmp_path)
    with stack:
        stack.spawn_discovery(
            "discovery-2",
            CAPDISC_SNAPSHOT_DIR=str(tmp_path / "fresh-snapshots"),
            CAPDISC_MAP_ABOVE="1",
            CAPDISC_BUILD_APART_TIMEOUT_S="0.001",
        )
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a message to the team's slack channel")

        assert answer.index_version == written and answer.ids[0] == SLACK
        failed = stack.events("discovery-2", "build_apart_failed")
        assert [e["tenant"] for e in failed] == [TENANT]
        assert "TimeoutExpired" in failed[0]["reason"]
        loaded = [e for e in stack.events("discovery-2", "index_loaded") if e["tenant"] == TENANT]
        assert [e["index_version"] for e in loaded] == [written]


def test_snapshots_that_cannot_be_written_are_said_so_without_a_traceback(
    tmp_path: Path,
) -> None:
    stack, _registry, _path, written = served_and_written(tmp_path)
    with stack:
        blocked = tmp_path / "blocked-snapshots"
        blocked.mkdir()
        (blocked / TENANT).write_text("a file where the tenant's snapshots go")
        stack.spawn_discovery(
            "discovery-2", CAPDISC_SNAPSHOT_DIR=str(blocked), CAPDISC_MAP_ABOVE="1"
        )
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            answer = client.discover("post a message to the team's slack channel")

        assert answer.index_version == written and answer.ids[0] == SLACK
        failed = stack.events("discovery-2", "build_apart_failed")
        assert [e["tenant"] for e in failed] == [TENANT]
        assert f"cannot write the snapshot of {TENANT} under {blocked}" in failed[0]["reason"]
        assert "Traceback" not in failed[0]["reason"] and 'File "' not in failed[0]["reason"]
        wait_for(
            lambda: stack.events("discovery-2", "snapshot_write_failed"), 30, "the write failed"
        )
        shown = wait_for(
            lambda: [
                line
                for line in _render_status(collect_status(stack.connection())).splitlines()
                if "FAILED" in line  # the first worker is stopped: discovery-2's
            ],
            30,
            "the failed write in the status",
        )
        assert f"snapshot of {TENANT} v{written} FAILED" in shown[0]


def large_tenant_served_apart(tmp_path: Path) -> tuple[PrivateStack, Path, Path, int]:
    """A stack whose second discovery worker built the tenant apart (``map_above`` 1) into a
    snapshot directory of its own and maps it; the stack, the registry copy, that directory and
    the version served."""
    stack, registry, _path, written = served_and_written(tmp_path)
    try:
        fresh = tmp_path / "fresh-snapshots"
        stack.spawn_discovery("discovery-2", CAPDISC_SNAPSHOT_DIR=str(fresh), CAPDISC_MAP_ABOVE="1")
        with Client(stack.connection(), tenant=TENANT, timeout_s=60) as client:
            assert client.discover("post a message to slack").index_version == written
        assert stack.events("discovery-2", "index_built_apart")
        return stack, registry, fresh, written
    except BaseException:
        stack.close()
        raise


def test_a_large_tenants_change_is_applied_by_a_child_and_mapped(tmp_path: Path) -> None:
    stack, registry, fresh, written = large_tenant_served_apart(tmp_path)
    with stack:
        changed = zebrafish_published(stack, registry, written)

        assert_zebrafish_served(stack, changed)
        assert updates_to(stack, "discovery-2", changed) == [(changed, "apart")]
        apart = stack.events("discovery-2", "index_changed_apart")
        assert [(e["tenant"], e["index_version"]) for e in apart] == [(TENANT, changed)]
        assert Path(apart[0]["path"]).parent.parent.parent == fresh  # the child's, mapped
        assert f"v{changed:012d}-" in Path(apart[0]["path"]).name
        assert not stack.events("discovery-2", "change_apart_failed")


def test_status_reports_the_snapshots_a_large_tenants_children_wrote(tmp_path: Path) -> None:
    stack, registry, _fresh, written = large_tenant_served_apart(tmp_path)
    with stack, stack.connection() as connection:
        worker = stack.processes["discovery-2"]

        def reported(version: int) -> dict[str, Any] | None:
            for beat in collect_status(connection)["workers"]:
                snapshot = beat.get("snapshots", {}).get(TENANT)
                if beat.get("pid") == worker.pid and snapshot:
                    return dict(snapshot) if snapshot["index_version"] == version else None
            return None

        built = wait_for(lambda: reported(written), 30, "the child's build in the heartbeat")
        assert 0 <= time.time() - built["written_at_unix_s"] < 120 and built["megabytes"] > 0
        changed = zebrafish_published(stack, registry, written)
        wait_for(lambda: reported(changed), 30, "the child's change in the heartbeat")
        shown = _render_status(collect_status(connection))
        assert f"snapshot of {TENANT} v{changed} written " in shown


def test_a_change_no_child_can_apply_is_applied_in_the_worker(tmp_path: Path) -> None:
    stack, registry, fresh, written = large_tenant_served_apart(tmp_path)
    with stack:
        for path in (fresh / TENANT).rglob("snapshot.json"):
            path.unlink()  # the mapped snapshot stays mapped; the child finds none to start from
        changed = zebrafish_published(stack, registry, written)

        assert_zebrafish_served(stack, changed)
        assert updates_to(stack, "discovery-2", changed) == [(changed, "in_process")]
        failed = stack.events("discovery-2", "change_apart_failed")
        assert [(e["tenant"], e["index_version"]) for e in failed] == [(TENANT, changed)]
        assert "exit status 4" in failed[0]["reason"]


def test_a_large_tenant_restarted_behind_its_snapshot_has_the_changes_applied_apart(
    tmp_path: Path,
) -> None:
    stack, registry, path, written = served_and_written(tmp_path)
    with stack:
        changed = zebrafish_published(stack, registry, written)  # while no worker runs
        stack.spawn_discovery(
            "discovery-2", CAPDISC_SNAPSHOT_DIR=str(path.parents[2]), CAPDISC_MAP_ABOVE="1"
        )

        assert_zebrafish_served(stack, changed)
        apart = stack.events("discovery-2", "index_changed_apart")
        assert [(e["tenant"], e["index_version"]) for e in apart] == [(TENANT, changed)]
        loaded = stack.events("discovery-2", "index_loaded_from_snapshot")
        assert [(e["snapshot_version"], e["index_version"]) for e in loaded] == [(written, changed)]
        assert loaded[0]["changes_applied"] == 1
