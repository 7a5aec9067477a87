"""A full reindex sends a window of its batches at a time: the start sends the first ones, each
built batch records the next of its lane in the outbox in the same transaction, and the plan of
the rest leaves nothing behind once the job ends. Real Redis; the last test through real
workers."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import redis

from capdisc import keys
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.reindexstore import (
    ReindexJob,
    abandon_reindex,
    all_built,
    batch_built,
    begin_reindex,
    finish_reindex,
    next_batch,
    resume_lanes,
    stage_vectors,
    stranded_batches,
)
from capdisc.registry.store import apply_event
from capdisc_producers.publisher import Publisher
from capdisc_producers.reindex import latest_change, start_full_reindex, wait_for_swap

from .conftest import INDEXING_ARGV, publish
from .private import PrivateStack
from .test_cli import run_cli


def _vec(value: float) -> bytes:
    return np.full(4, value, dtype=np.float32).tobytes()


def _stored(connection: redis.Redis, tenant: str, count: int) -> list[str]:
    """``count`` capabilities stored for ``tenant``; their ids, sorted."""
    for seq in range(1, count + 1):
        cap = Capability(id=f"tool:c{seq:03d}", kind="tool", name=f"c{seq:03d}", description="x")
        event = RegistryEvent(
            type="upsert", tenant=tenant, capability_id=cap.id, seq=seq, capability=cap.to_dict()
        )
        apply_event(connection, event, cap, lambda _c: _vec(1.0), "space")
    return sorted(f"tool:c{seq:03d}" for seq in range(1, count + 1))


def _job(connection: redis.Redis, tenant: str) -> ReindexJob:
    job = ReindexJob.read(connection, tenant)
    assert job is not None
    return job


def _plan(connection: redis.Redis, tenant: str, job: str) -> dict[int, list[str]]:
    raw = connection.hgetall(keys.reindex_plan(tenant, job))
    return {int(k): json.loads(v) for k, v in raw.items()}


def _recorded(connection: redis.Redis, task_id: str) -> dict[str, object] | None:
    raw = connection.hget(keys.OUTBOX, task_id)
    return json.loads(raw) if raw is not None else None


def test_a_reindex_begun_with_a_window_sends_that_many_batches_and_plans_the_rest(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)

    sent = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)

    assert sent == {0: [ids[0]], 1: [ids[1]]}
    assert _plan(connection, tenant, "job1") == {2: [ids[2]], 3: [ids[3]], 4: [ids[4]]}
    assert (_job(connection, tenant).batches, _job(connection, tenant).window) == (5, 2)


def test_a_reindex_with_no_more_batches_than_its_window_sends_them_all_and_plans_none(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 3)

    sent = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=3)

    assert sent == {0: [ids[0]], 1: [ids[1]], 2: [ids[2]]}
    assert not connection.exists(keys.reindex_plan(tenant, "job1"))
    assert _job(connection, tenant).window == 0


def test_a_staged_batch_records_the_next_of_its_lane_in_the_outbox_and_takes_it_off_the_plan(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    then = next_batch(connection, job, 0)
    assert then is not None

    last = stage_vectors(connection, tenant, "job1", 0, {ids[0]: _vec(2.0)}, then)

    entry = _recorded(connection, then.task_id(job))
    assert last is False and (then.number, then.ids) == (2, [ids[2]])
    assert entry is not None and entry["name"] == keys.TASK_REINDEX_BATCH
    assert entry["args"] == [tenant, "job1", 2, [ids[2]]]
    assert 2 not in _plan(connection, tenant, "job1")
    assert batch_built(connection, job, 0) == (True, False)


def test_the_last_batch_of_a_lane_sends_nothing_after_it(
    connection: redis.Redis, tenant: str
) -> None:
    _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)

    assert [next_batch(connection, job, n) is None for n in range(5)] == [
        False,
        False,
        False,
        True,
        True,
    ]


def test_a_start_delivered_again_resends_the_unbuilt_first_batches_and_plans_nothing_new(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    stage_vectors(
        connection, tenant, "job1", 0, {ids[0]: _vec(2.0)}, next_batch(connection, job, 0)
    )
    plan = _plan(connection, tenant, "job1")

    again = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)

    drafts = list(connection.scan_iter(match=f"{keys.reindex_plan(tenant, 'job1')}:*"))
    assert again == {1: [ids[1]]}
    assert _plan(connection, tenant, "job1") == plan and drafts == []
    assert _job(connection, tenant) == job


def test_a_damaged_plan_entry_is_sent_empty_saying_why_and_the_swap_embeds_its_ids(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 3)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=1)
    connection.hset(keys.reindex_plan(tenant, "job1"), 1, "{not json")
    job = _job(connection, tenant)

    then = next_batch(connection, job, 0)
    assert then is not None and then.ids == [] and then.problem
    assert "field 1" in then.problem and keys.reindex_plan(tenant, "job1") in then.problem
    stage_vectors(connection, tenant, "job1", 0, {ids[0]: _vec(3.0)}, then)
    stage_vectors(connection, tenant, "job1", 1, {}, next_batch(connection, job, 1))
    stage_vectors(connection, tenant, "job1", 2, {ids[2]: _vec(3.0)})
    version = finish_reindex(
        connection, tenant, "job1", lambda caps: {c.id: _vec(4.0) for c in caps}
    )

    assert version is not None
    assert connection.hget(keys.vectors(tenant, "space"), ids[1]) == _vec(4.0)


def test_every_lane_built_in_turn_swaps_the_job_in_and_leaves_no_plan(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)
    sent = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    waiting = dict(sent or {})
    while waiting:
        number, batch = waiting.popitem()
        then = next_batch(connection, job, number)
        stage_vectors(connection, tenant, "job1", number, {i: _vec(3.0) for i in batch}, then)
        if then is not None:
            waiting[then.number] = then.ids

    built = all_built(connection, job)
    version = finish_reindex(connection, tenant, "job1", lambda caps: {})

    assert built and version is not None
    assert not connection.exists(keys.reindex_plan(tenant, "job1"))
    assert {connection.hget(keys.vectors(tenant, "space"), i) for i in ids} == {_vec(3.0)}


def test_an_abandoned_or_superseded_reindex_leaves_no_plan(
    connection: redis.Redis, tenant: str
) -> None:
    _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    begin_reindex(connection, tenant, "job2", "space", 1, fresh=False, window=2)
    abandon_reindex(connection, _job(connection, tenant), "stopped")

    assert not connection.exists(keys.reindex_plan(tenant, "job1"))
    assert not connection.exists(keys.reindex_plan(tenant, "job2"))
    assert ReindexJob.read(connection, tenant) is None


def _published(private: PrivateStack, tmp_path: Path, tenant: str, **env: str) -> None:
    """An indexing worker (with ``env``) started, and 300 tools published to ``tenant``:
    five batches of the workers' 64."""
    registry = tmp_path / "registry"
    for n in range(300):
        (registry / f"tool-{n:03d}").mkdir(parents=True)
        (registry / f"tool-{n:03d}" / "CAPABILITY.yaml").write_text(
            f"name: tool-{n:03d}\nkind: tool\ndescription: Does thing number {n}.\n"
        )
    private.spawn("indexing", [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"], **env)
    assert publish(private.url, registry, tenant, wait_s=90).complete


def test_a_batch_staged_without_its_successor_strands_its_lane_until_it_is_resumed(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    stage_vectors(connection, tenant, "job1", 0, {ids[0]: _vec(2.0)})  # as an older worker does

    stranded = stranded_batches(connection, job)
    resumed = resume_lanes(connection, job)

    assert [(b.number, b.ids) for b in stranded] == [(2, [ids[2]])]
    assert [(b.number, b.ids) for b in resumed] == [(2, [ids[2]])]
    entry = _recorded(connection, resumed[0].task_id(job))
    assert entry is not None and entry["args"] == [tenant, "job1", 2, [ids[2]]]
    assert 2 not in _plan(connection, tenant, "job1")
    assert stranded_batches(connection, job) == []


def test_lanes_that_send_their_successors_are_never_taken_for_stranded(
    connection: redis.Redis, tenant: str
) -> None:
    ids = _stored(connection, tenant, 5)
    begin_reindex(connection, tenant, "job1", "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    for number in (0, 1):
        then = next_batch(connection, job, number)
        stage_vectors(connection, tenant, "job1", number, {ids[number]: _vec(2.0)}, then)

    assert stranded_batches(connection, job) == []
    assert resume_lanes(connection, job) == []
    assert sorted(_plan(connection, tenant, "job1")) == [4]


def test_a_reindex_no_longer_building_resumes_nothing(connection: redis.Redis, tenant: str) -> None:
    ids = _stored(connection, tenant, 5)
    name = uuid.uuid4().hex  # the outbox is shared by every test
    begin_reindex(connection, tenant, name, "space", 1, fresh=False, window=2)
    job = _job(connection, tenant)
    stage_vectors(connection, tenant, name, 0, {ids[0]: _vec(2.0)})
    abandon_reindex(connection, job, "stopped")

    assert resume_lanes(connection, job) == []
    assert _recorded(connection, f"reindex-{name}-2") is None


def test_the_reconciler_resumes_a_reindex_whose_lane_an_older_worker_stopped(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path / "stack", durable=False) as private:
        tenant = "upgrading"
        _published(private, tmp_path, tenant)
        connection = private.connection()
        space = connection.get(keys.space(tenant))
        assert space is not None
        after = latest_change(connection)
        # begun with a window of one lane, its first batch built by a worker that sends no
        # successor: the lane stops there
        sent = begin_reindex(connection, tenant, "job1", space.decode(), 64, True, window=1)
        assert sent is not None and list(sent) == [0]
        stage_vectors(connection, tenant, "job1", 0, {})

        report = json.loads(run_cli("reconcile", "--json", env=private.env).stdout)
        swapped = wait_for_swap(connection, tenant, "job1", after, timeout_s=90)

        assert report["reindex_batches_resumed"] == 1
        assert swapped is not None
        live = set(connection.hkeys(keys.vectors(tenant, space.decode())))
        assert live == set(connection.hkeys(keys.caps(tenant))) and len(live) == 300
        assert [e["batches"] for e in private.events("indexing", "reindex_lanes_resumed")] == [[1]]


def test_a_reindex_of_many_batches_swaps_in_through_workers_sending_one_batch_at_a_time(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path / "stack", durable=False) as private:
        tenant = "windowed"
        _published(private, tmp_path, tenant, CAPDISC_PUBLISH_MAX_PENDING_TASKS="1")
        connection = private.connection()
        publisher = Publisher(private.url)

        job, after = start_full_reindex(connection, publisher, tenant, fresh=True)
        swapped = wait_for_swap(connection, tenant, job, after, timeout_s=90)
        publisher.close()
        started = private.events("indexing", "reindex_started")

        space = connection.get(keys.space(tenant))
        assert swapped is not None and space is not None
        live = set(connection.hkeys(keys.vectors(tenant, space.decode())))
        assert live == set(connection.hkeys(keys.caps(tenant))) and len(live) == 300
        assert [(e["batches"], e["sent"]) for e in started] == [(5, 1)]
        assert not connection.exists(keys.reindex_plan(tenant, job))
