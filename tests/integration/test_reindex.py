"""Full (blue/green) reindex and per-capability reindex through the real workers: discovery
keeps answering during a swap, changes made during a build are in the swapped index, and a
tenant moves to a new embedding model without a request failing."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.reindexstore import (
    ReindexJob,
    abandon_reindex,
    begin_reindex,
    finish_reindex,
    stage_vectors,
)
from capdisc.registry.store import apply_event
from capdisc_producers.publisher import Publisher
from capdisc_producers.reindex import start_full_reindex, wait_for_swap

from .conftest import DISCOVERY_ARGV, INDEXING_ARGV, Stack, publish, wait_for
from .test_cli import run_cli


def _cap(name: str, description: str) -> Capability:
    return Capability(id=f"tool:{name}", kind="tool", name=name, description=description)


def _upsert(tenant: str, cap: Capability, seq: int) -> RegistryEvent:
    return RegistryEvent(
        type="upsert", tenant=tenant, capability_id=cap.id, seq=seq, capability=cap.to_dict()
    )


def _vec(value: float) -> bytes:
    return np.full(4, value, dtype=np.float32).tobytes()


class Hammer:
    """Discovery requests in a loop on a thread, counting failures and empty answers."""

    def __init__(self, client: Client, query: str) -> None:
        self.client, self.query = client, query
        self.answers = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                answer = self.client.discover(self.query)
            except Exception as exc:  # every failure is what we count
                self.failures.append(repr(exc))
                continue
            self.answers += 1
            if not answer.capabilities:
                self.failures.append(f"empty answer at version {answer.index_version}")

    def __enter__(self) -> Hammer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_full_reindex_swaps_in_while_discovery_keeps_answering(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)
    client = Client(stack.connection(), tenant=tenant, timeout_s=20)
    client.discover("post a message to slack", min_version=report.index_version)
    publisher = Publisher(stack.url)

    with Hammer(
        Client(stack.connection(), tenant=tenant, timeout_s=20), "post a message to slack"
    ) as hammer:
        job, after = start_full_reindex(connection, publisher, tenant, fresh=True)
        swapped = wait_for_swap(connection, tenant, job, after, timeout_s=60)
        answer = client.discover("post a message to slack", min_version=swapped or 0)
    publisher.close()

    assert swapped is not None and swapped > report.index_version
    assert answer.index_version >= swapped
    assert answer.capabilities[0]["id"] == "tool:slack-post-message"
    assert hammer.failures == [] and hammer.answers > 0
    assert ReindexJob.read(connection, tenant) is None


def test_a_change_made_while_a_reindex_builds_is_in_the_swapped_index(
    connection: redis.Redis, tenant: str
) -> None:
    old, new = _cap("clock", "Tells the time."), _cap("clock", "Tells the time in any zone.")
    apply_event(connection, _upsert(tenant, old, 1), old, lambda _c: _vec(1.0), "space")
    batches = begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)

    apply_event(connection, _upsert(tenant, new, 2), new, lambda _c: _vec(2.0), "space")
    stage_vectors(connection, tenant, "job1", 0, {old.id: _vec(1.5)})  # built from the old
    version = finish_reindex(connection, tenant, "job1", lambda caps: {})

    assert batches == {0: [old.id]}
    assert version is not None
    assert connection.hget(keys.vectors(tenant, "space"), old.id) == _vec(2.0)


def test_a_capability_deleted_while_a_reindex_builds_stays_deleted(
    connection: redis.Redis, tenant: str
) -> None:
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "space")
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)
    delete = RegistryEvent(type="delete", tenant=tenant, capability_id=cap.id, seq=2)

    apply_event(connection, delete, None, lambda _c: _vec(0.0), "space")
    stage_vectors(connection, tenant, "job1", 0, {cap.id: _vec(1.0)})  # read before the delete
    finish_reindex(connection, tenant, "job1", lambda caps: {})

    assert not connection.hexists(keys.vectors(tenant, "space"), cap.id)
    assert not connection.hexists(keys.caps(tenant), cap.id)


def test_the_swap_embeds_what_no_batch_staged_and_moves_the_tenant_to_the_new_space(
    connection: redis.Redis, tenant: str
) -> None:
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "old")
    begin_reindex(connection, tenant, "job1", "new", 64, fresh=True)

    version = finish_reindex(
        connection, tenant, "job1", lambda caps: {c.id: _vec(9.0) for c in caps}
    )

    assert connection.get(keys.space(tenant)) == b"new"
    assert connection.hget(keys.vectors(tenant, "new"), cap.id) == _vec(9.0)
    assert not connection.exists(keys.vectors(tenant, "old"))
    last = connection.xrevrange(keys.CHANGES, count=1)[0][1]
    assert (last[b"op"], int(last[b"version"])) == (b"reload", version)


def test_a_superseded_reindex_stages_nothing_and_does_not_swap(
    connection: redis.Redis, tenant: str
) -> None:
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "space")
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)
    begin_reindex(connection, tenant, "job2", "space", 64, fresh=False)

    assert stage_vectors(connection, tenant, "job1", 0, {cap.id: _vec(5.0)}) is None
    assert finish_reindex(connection, tenant, "job1", lambda caps: {}) is None
    assert ReindexJob.read(connection, tenant).job == "job2"  # type: ignore[union-attr]


def _three_caps(connection: redis.Redis, tenant: str) -> list[Capability]:
    caps = [_cap(name, f"Does {name}.") for name in ("alpha", "beta", "gamma")]
    for seq, cap in enumerate(caps, 1):
        apply_event(connection, _upsert(tenant, cap, seq), cap, lambda _c: _vec(1.0), "space")
    return caps


def test_a_reindex_start_delivered_again_continues_the_job_not_from_scratch(
    connection: redis.Redis, tenant: str
) -> None:
    """A worker killed after starting a job and before acking its start task gets it
    delivered again: the batches built stay built and only the others are sent again."""
    alpha, beta, gamma = _three_caps(connection, tenant)
    first = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False)
    started = ReindexJob.read(connection, tenant)
    stage_vectors(connection, tenant, "job1", 0, {alpha.id: _vec(3.0)})

    again = begin_reindex(connection, tenant, "job1", "space", 1, fresh=False)

    assert ReindexJob.read(connection, tenant) == started
    staging = keys.vectors(tenant, keys.staging_space("space", "job1"))
    assert connection.hget(staging, alpha.id) == _vec(3.0)
    assert first == {0: [alpha.id], 1: [beta.id], 2: [gamma.id]}
    assert again == {1: [beta.id], 2: [gamma.id]}
    assert stage_vectors(connection, tenant, "job1", 1, {beta.id: _vec(3.0)}) is False
    assert stage_vectors(connection, tenant, "job1", 2, {gamma.id: _vec(3.0)}) is True


def test_a_reindex_start_sent_twice_to_the_workers_swaps_in_once_and_leaves_nothing_behind(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    """The start task delivered again (a worker killed before acking it), through real
    workers: arriving while the job builds or after its swap, it leaves one swap."""
    publish(stack.url, registry, tenant)
    publisher = Publisher(stack.url)
    job, after = start_full_reindex(connection, publisher, tenant, fresh=True)
    publisher.start_reindex(tenant, job, True)  # delivered again while the job builds
    swapped = wait_for_swap(connection, tenant, job, after, timeout_s=60)
    publisher.start_reindex(tenant, job, True)  # and again after its swap
    publisher.close()
    wait_for(
        lambda: not any(job.encode() in v for v in connection.hvals(keys.OUTBOX)),
        30,
        "both starts and every batch finished",
    )

    reloads = [
        fields
        for _id, fields in connection.xrange(keys.CHANGES, min=f"({after}")
        if fields[b"tenant"].decode() == tenant and fields[b"op"] == b"reload"
    ]
    space = connection.get(keys.space(tenant))
    assert swapped is not None and len(reloads) == 1
    assert ReindexJob.read(connection, tenant) is None
    assert space is not None
    live = keys.vectors(tenant, space.decode())
    assert set(connection.hkeys(live)) == set(connection.hkeys(keys.caps(tenant)))
    assert not connection.exists(keys.vectors(tenant, keys.staging_space(space.decode(), job)))


def test_a_reindex_start_delivered_again_after_its_swap_or_a_newer_job_does_nothing(
    connection: redis.Redis, tenant: str
) -> None:
    ids = sorted(cap.id for cap in _three_caps(connection, tenant))
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)
    version = finish_reindex(
        connection, tenant, "job1", lambda caps: {c.id: _vec(2.0) for c in caps}
    )
    begin_reindex(connection, tenant, "job2", "space", 64, fresh=False)

    late = begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)

    assert ReindexJob.read(connection, tenant).job == "job2"  # type: ignore[union-attr]
    assert version is not None and late is None
    assert begin_reindex(connection, tenant, "job2", "space", 64, fresh=False) == {0: ids}
    assert finish_reindex(
        connection, tenant, "job2", lambda caps: {c.id: _vec(3.0) for c in caps}
    ) == (version + 1)
    assert begin_reindex(connection, tenant, "job2", "space", 64, fresh=False) is None
    assert ReindexJob.read(connection, tenant) is None
    assert begin_reindex(connection, tenant, "job3", "space", 64, fresh=False) == {0: ids}


def test_a_reindex_superseded_while_its_swap_embeds_leaves_no_staging_vectors_behind(
    connection: redis.Redis, tenant: str
) -> None:
    """Two ``reindex --all`` at once: the first one's swap embeds what no batch staged while
    the second starts (deleting the first's staging space); what it embedded is not written
    back into a staging space nothing would ever delete (a tenant's whole vectors each time)."""
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "space")
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)

    def embed_while_another_starts(caps: list[Capability]) -> dict[str, bytes]:
        begin_reindex(connection, tenant, "job2", "space", 64, fresh=False)
        return {c.id: _vec(5.0) for c in caps}

    assert finish_reindex(connection, tenant, "job1", embed_while_another_starts) is None
    assert not connection.exists(keys.vectors(tenant, keys.staging_space("space", "job1")))
    assert ReindexJob.read(connection, tenant).job == "job2"  # type: ignore[union-attr]


def test_abandoning_a_reindex_another_one_superseded_leaves_the_newer_one_building(
    connection: redis.Redis, tenant: str
) -> None:
    """The reconciler (or a batch out of attempts) read the old job, then a new ``reindex
    --all`` started: dropping the old one must not drop the new one's marker."""
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "space")
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)
    old = ReindexJob.read(connection, tenant)
    begin_reindex(connection, tenant, "job2", "space", 64, fresh=False)

    assert old is not None
    dropped = abandon_reindex(connection, old, "timed out")

    assert ReindexJob.read(connection, tenant) is not None
    assert stage_vectors(connection, tenant, "job2", 0, {cap.id: _vec(2.0)}) is True
    assert dropped is False


def test_a_reindex_of_a_tenant_holding_a_value_that_is_no_record_swaps_in(
    connection: redis.Redis, tenant: str
) -> None:
    """The swap embedded what no batch staged again and again while a value could not be
    read as a record: the indexing worker spun until its task's time limit, then again."""
    cap = _cap("clock", "Tells the time.")
    apply_event(connection, _upsert(tenant, cap, 1), cap, lambda _c: _vec(1.0), "space")
    connection.hset(keys.caps(tenant), "tool:broken", "not a record")
    begin_reindex(connection, tenant, "job1", "space", 64, fresh=False)
    swapped: list[int | None] = []
    swap = threading.Thread(
        target=lambda: swapped.append(
            finish_reindex(connection, tenant, "job1", lambda caps: {c.id: _vec(2.0) for c in caps})
        ),
        daemon=True,
    )

    swap.start()
    swap.join(timeout=10)

    assert swapped and swapped[0] is not None
    assert connection.hget(keys.vectors(tenant, "space"), cap.id) == _vec(2.0)
    assert ReindexJob.read(connection, tenant) is None


def test_a_reindex_of_a_tenant_whose_every_value_is_no_record_swaps_in_cleanly(
    connection: redis.Redis, tenant: str
) -> None:
    """Nothing can be staged, so the staging vectors never exist: the swap must not rename
    a key that is not there (the transaction's other steps ran, and the task failed)."""
    connection.hset(keys.caps(tenant), "tool:broken", "not a record")
    connection.hset(keys.vectors(tenant, "old-space"), "tool:broken", _vec(1.0))
    connection.set(keys.space(tenant), "old-space")
    begin_reindex(connection, tenant, "job1", "new-space", 64, fresh=False)

    version = finish_reindex(connection, tenant, "job1", lambda caps: {})

    assert version is not None
    assert connection.get(keys.space(tenant)) == b"new-space"
    assert not connection.exists(keys.vectors(tenant, "old-space"))
    assert ReindexJob.read(connection, tenant) is None


def test_reindex_of_one_capability_embeds_it_again_and_bumps_the_version(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)
    calls = int(connection.hget(keys.COUNTERS, "embedding_calls") or 0)

    result = run_cli(
        "reindex", "tool:slack-post-message", "tool:no-such-tool", "--tenant", tenant, env=stack.env
    )

    assert result.returncode == 1, result.stderr  # an id the tenant does not hold
    assert "tool:slack-post-message: reindexed" in result.stdout
    assert "tool:no-such-tool: not found" in result.stdout
    assert "holds no tool:no-such-tool" in result.stderr
    assert f"index version {report.index_version + 1}" in result.stdout
    assert int(connection.hget(keys.COUNTERS, "embedding_calls") or 0) > calls


def test_delete_of_a_whole_source_removes_every_capability_it_published(
    stack: Stack, registry: Path, tenant: str, connection: redis.Redis
) -> None:
    report = publish(stack.url, registry, tenant)

    result = run_cli(
        "delete", "--source", str(registry.resolve()), "--tenant", tenant, env=stack.env
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": deleted") == len(report.plan.upserts)
    assert connection.hlen(keys.caps(tenant)) == 0


@pytest.fixture
def private_stack(stack: Stack, tmp_path: Path) -> Stack:
    """Workers of the suite's Redis on a queue of their own would still share tenants' state;
    a model change needs indexing workers of another embedder, so it gets its own Redis."""
    from capdisc.localredis import start_redis

    from .conftest import worker_env

    server = start_redis(tmp_path / "redis", durable=False)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    private = Stack(server, worker_env(server.url), log_dir, [])
    yield private  # type: ignore[misc]
    for process in private.processes:
        process.terminate()
        process.wait(timeout=15)
    server.stop()


def test_a_tenant_moves_to_a_new_embedding_model_without_a_failed_request(
    private_stack: Stack, registry: Path
) -> None:
    url, tenant = private_stack.url, "models"
    name = f"indexing-{uuid.uuid4().hex[:6]}@%h"
    old_worker = private_stack.spawn("indexing-384", [*INDEXING_ARGV, "-n", name])
    private_stack.spawn("discovery", DISCOVERY_ARGV)
    report = publish(url, registry, tenant, wait_s=90)
    client = Client(private_stack.connection(), tenant=tenant, timeout_s=30)
    client.discover("post a message to slack", min_version=report.index_version)
    old_worker.terminate()
    old_worker.wait(timeout=15)
    private_stack.spawn(
        "indexing-256",
        [*INDEXING_ARGV, "-n", name.replace("-", "-b-", 1)],
        CAPDISC_HASHING_DIM="256",
    )
    connection = private_stack.connection()

    with Hammer(
        Client(private_stack.connection(), tenant=tenant, timeout_s=30), "post a message to slack"
    ) as hammer:
        job, after = start_full_reindex(connection, Publisher(url), tenant)
        swapped = wait_for_swap(connection, tenant, job, after, timeout_s=90)
        answer = client.discover("post a message to slack", min_version=swapped or 0)

    assert swapped is not None
    assert connection.get(keys.space(tenant)) == b"hashing-256.fs1"
    assert answer.capabilities[0]["id"] == "tool:slack-post-message"
    assert hammer.failures == [] and hammer.answers > 0
    workers = json.loads(run_cli("status", "--json", env=private_stack.env).stdout)["workers"]
    assert {w["kind"] for w in workers} == {"indexing", "discovery"}


def test_a_reindex_whose_embedder_keeps_failing_is_abandoned_saying_why(
    private_stack: Stack, registry: Path
) -> None:
    from capdisc.errors import EmbeddingError

    from .test_openai_embedder import Server, indexing_env

    server = Server()
    try:
        private_stack.spawn(
            "indexing-openai",
            [*INDEXING_ARGV, "-n", f"indexing-{uuid.uuid4().hex[:6]}@%h"],
            **indexing_env(server, max_attempts=2, retry_base_s=0.1),
        )
        url, tenant = private_stack.url, "failing"
        report = publish(url, registry, tenant, wait_s=90)
        server.script = [(503, {"error": {"message": "overloaded"}}, {})] * 1000
        connection = private_stack.connection()

        job, after = start_full_reindex(connection, Publisher(url), tenant, fresh=True)
        with pytest.raises(EmbeddingError) as info:
            wait_for_swap(connection, tenant, job, after, timeout_s=30)
    finally:
        server.close()

    assert "abandoned" in str(info.value) and "HTTP 503" in str(info.value)
    assert ReindexJob.read(connection, tenant) is None  # the reconciler no longer holds off
    assert int(connection.get(keys.version(tenant)) or 0) == report.index_version
