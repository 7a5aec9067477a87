"""A full reindex of one tenant in Redis, blue/green: the job marker, the staging vector space
its batches are built into beside the live one, and the swap.

:func:`begin_reindex` records the job and cuts the tenant's capabilities into batches (begun
again, it continues the job or does nothing); indexing
workers store each built batch with :func:`stage_vectors` (a writer stages the capabilities it
changes meanwhile too: :func:`capdisc.registry.store.apply_events`); the last batch calls
:func:`finish_reindex`, which renames the staging vectors over the target space, serves it and
bumps the version in one transaction. :func:`abandon_reindex` drops a job that will not finish.

Vectors that go (the ones replaced, an abandoned staging space) are UNLINKed: Redis frees a
hash of every vector in the background instead of holding every other client meanwhile.

A large job's batches are not all sent at once: begun with a ``window``, it sends that many
(the heads of as many lanes) and keeps the rest in a plan hash; batch ``n``, when it is staged,
records batch ``n + window`` in the outbox in the same transaction (:func:`next_batch`), so at
most ``window`` batch tasks wait at any time and none is lost between the two. A lane stopped by
a worker that does not send successors (one older than the window) is resumed by the
reconciler (:func:`resume_lanes`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from capdisc import keys
from capdisc.models import Capability
from capdisc.redisclock import redis_now_ms
from capdisc.redistext import as_str
from capdisc.registry import outbox
from capdisc.registry.policy import stored_capability
from capdisc.registry.store import CHANGES_MAXLEN

Redis = redis.Redis


@dataclass(frozen=True)
class ReindexJob:
    """A full reindex of one tenant being built into a staging space beside the live one."""

    tenant: str
    job: str
    target: str
    batches: int
    fresh: bool
    started_at_ms: int
    #: How many batches were sent at the start, each the head of a lane that sends the next
    #: (0: every batch was sent at the start).
    window: int = 0

    @property
    def staging(self) -> str:
        return keys.staging_space(self.target, self.job)

    @classmethod
    def read(cls, client: Any, tenant: str) -> ReindexJob | None:
        raw = {as_str(k): as_str(v) for k, v in client.hgetall(keys.reindex(tenant)).items()}
        if not raw:
            return None
        return cls(
            tenant,
            raw["job"],
            raw["target"],
            int(raw["batches"]),
            raw.get("fresh") == "1",
            int(raw.get("started_at_ms", 0)),
            int(raw.get("window", 0)),
        )


#: How long the reason a reindex was abandoned is kept for a ``capdisc reindex`` waiting on it,
#: and the mark that a reindex was begun (so its start delivered again does not restart it).
FAILED_TTL_S = 24 * 3600


def begin_reindex(
    client: Redis,
    tenant: str,
    job: str,
    target: str,
    batch_size: int,
    fresh: bool,
    window: int = 0,
) -> dict[int, list[str]] | None:
    """Start building ``tenant``'s vectors in ``target`` beside the live index: record the job
    (superseding one already building) and return the batches of capability ids to send now,
    by number: all of them, or with ``window`` > 0 the first ``window`` (the rest wait in the
    plan, each sent by the batch ``window`` before it: :func:`next_batch`). A capability
    written after this is staged by its writer; one written just before, by the swap.

    Begun already (its start task delivered again, say after a worker died before acking
    it): the job continues, not from scratch. While it is still the one building, the
    batches sent at the start and not built yet are returned (cut from the capabilities
    stored now; whatever they miss the swap embeds), possibly none; once it was swapped in,
    abandoned or superseded, None: there is nothing to do."""
    ids = sorted(as_str(k) for k in client.hkeys(keys.caps(tenant)))
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    begun = keys.reindex_begun(tenant, job)
    lanes = window if 0 < window < len(batches) else 0
    written = (
        None
        if not lanes or client.exists(begun)
        else _write_plan(client, tenant, job, batches, lanes)
    )
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(begun, keys.reindex(tenant))  # type: ignore[no-untyped-call]
                previous = ReindexJob.read(pipe, tenant)
                if pipe.exists(begun):
                    pipe.unwatch()
                    if written:
                        client.unlink(written)
                    return _not_built(client, previous, job, batches)
                pipe.multi()
                if previous is not None:
                    pipe.unlink(*_job_keys(tenant, previous))
                pipe.delete(keys.reindex(tenant))
                pipe.hset(
                    keys.reindex(tenant),
                    mapping={
                        "job": job,
                        "target": target,
                        "batches": len(batches),
                        "fresh": int(fresh),
                        "started_at_ms": redis_now_ms(client),
                        "window": lanes,
                    },
                )
                if written:
                    pipe.rename(written, keys.reindex_plan(tenant, job))
                pipe.set(begun, 1, ex=FAILED_TTL_S)
                pipe.sadd(keys.TENANTS, tenant)
                pipe.execute()
                return {number: batches[number] for number in range(lanes or len(batches))}
            except redis.WatchError:
                continue


#: Plan entries written per round trip.
PLAN_CHUNK = 512


def _write_plan(client: Redis, tenant: str, job: str, batches: list[list[str]], lanes: int) -> str:
    """The batches after the first ``lanes`` written to a key of their own (renamed to the
    job's plan when the job is recorded); its name. It expires with the job's marks, should
    the job never be recorded or finish."""
    temporary = keys.reindex_plan_draft(tenant, job, uuid.uuid4().hex)
    numbers = range(lanes, len(batches))
    for start in range(0, len(numbers), PLAN_CHUNK):
        chunk = numbers[start : start + PLAN_CHUNK]
        client.hset(temporary, mapping={n: json.dumps(batches[n]) for n in chunk})
    client.expire(temporary, FAILED_TTL_S)
    return temporary


def _job_keys(tenant: str, job: ReindexJob) -> tuple[str, ...]:
    """What a job leaves in Redis besides its marker: staging vectors, built batches, plan."""
    return (
        keys.vectors(tenant, job.staging),
        keys.reindex_done(tenant, job.job),
        keys.reindex_plan(tenant, job.job),
    )


def _not_built(
    client: Any, current: ReindexJob | None, job: str, batches: list[list[str]]
) -> dict[int, list[str]] | None:
    """The batches of ``job``, begun already, sent at its start and not built yet; None when
    it is no longer the one building."""
    if current is None or current.job != job:
        return None
    done = {int(as_str(n)) for n in client.smembers(keys.reindex_done(current.tenant, job))}
    return {
        number: batches[number] if number < len(batches) else []
        for number in range(current.window or current.batches)
        if number not in done
    }


@dataclass(frozen=True)
class NextBatch:
    """The batch a built batch sends after it, in its lane. ``problem``: why its plan entry
    could not be read (then it has no ids: the lane goes on, and the swap embeds what it
    would have held)."""

    number: int
    ids: list[str]
    problem: str | None = None

    def task_id(self, job: ReindexJob) -> str:
        """One id whoever sends it (a batch built twice records it once)."""
        return f"reindex-{job.job}-{self.number}"

    def args(self, job: ReindexJob) -> list[Any]:
        return [job.tenant, job.job, self.number, self.ids]


def next_batch(client: Any, job: ReindexJob, number: int) -> NextBatch | None:
    """The batch that batch ``number`` of ``job`` sends once it is staged; None at the end of
    its lane, or when every batch was sent at the start."""
    following = number + job.window
    if not job.window or following >= job.batches:
        return None
    raw = client.hget(keys.reindex_plan(job.tenant, job.job), following)
    return None if raw is None else _planned(job, following, raw)


def _planned(job: ReindexJob, number: int, raw: Any) -> NextBatch:
    """Batch ``number`` as its plan entry ``raw`` holds it (no ids and the problem, when the
    entry is not a JSON list of ids)."""
    try:
        ids = json.loads(raw)
    except ValueError:
        ids = None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        plan = keys.reindex_plan(job.tenant, job.job)
        return NextBatch(number, [], f"{plan} field {number}: not a JSON list of ids")
    return NextBatch(number, ids)


def stranded_batches(client: Any, job: ReindexJob) -> list[NextBatch]:
    """The planned batches whose lane stopped: the batch before each in its lane is built, yet
    the batch itself is still in the plan. A worker that stages a batch takes its successor
    out of the plan in the same transaction, so this happens only when one that does not (an
    indexing worker older than the window, in a fleet being upgraded) built the batch before
    it. Plan and built batches are read in one transaction, so a lane going on meanwhile is
    not taken for stranded."""
    if not job.window:
        return []
    plan = keys.reindex_plan(job.tenant, job.job)
    with client.pipeline(transaction=True) as pipe:
        pipe.hkeys(plan)
        pipe.smembers(keys.reindex_done(job.tenant, job.job))
        planned, built = pipe.execute()
    done = {int(as_str(n)) for n in built}
    numbers = sorted(n for n in map(int, map(as_str, planned)) if n - job.window in done)
    if not numbers:
        return []
    raws = client.hmget(plan, numbers)
    return [_planned(job, n, raw) for n, raw in zip(numbers, raws, strict=True) if raw]


def resume_lanes(client: Redis, job: ReindexJob) -> list[NextBatch]:
    """Record every stranded batch of ``job`` (:func:`stranded_batches`) in the outbox and
    take it out of the plan, in one transaction while the job is still the one building; the
    batches the caller is to send now (none when the job is no longer building)."""
    stranded = stranded_batches(client, job)
    if not stranded:
        return []
    now_ms = redis_now_ms(client)

    def queue(pipe: Any, current: ReindexJob) -> None:
        for batch in stranded:
            args = batch.args(current)
            outbox.record(pipe, batch.task_id(current), keys.TASK_REINDEX_BATCH, args, None, now_ms)
        pipe.hdel(keys.reindex_plan(job.tenant, job.job), *(b.number for b in stranded))

    return stranded if while_building(client, job.tenant, job.job, queue) else []


def all_built(client: Any, job: ReindexJob) -> bool:
    """Whether every batch of ``job`` is built (none to build: True)."""
    return int(client.scard(keys.reindex_done(job.tenant, job.job))) >= job.batches


def batch_built(client: Any, job: ReindexJob, number: int) -> tuple[bool, bool]:
    """Whether batch ``number`` of ``job`` is built, and whether every batch is."""
    with client.pipeline(transaction=False) as pipe:
        pipe.sismember(keys.reindex_done(job.tenant, job.job), number)
        pipe.scard(keys.reindex_done(job.tenant, job.job))
        this, count = pipe.execute()
    return bool(this), int(count) >= job.batches


def abandon_reindex(client: Redis, job: ReindexJob, reason: str | None = None) -> bool:
    """Drop a reindex that will not finish (its staging vectors and marker), keeping
    ``reason`` for whoever waits on it; the live index is untouched. Whether it was dropped:
    not when it is no longer the one building (a reindex started since is left alone)."""

    def queue(pipe: Any, _current: ReindexJob) -> None:
        pipe.unlink(*_job_keys(job.tenant, job))
        pipe.delete(keys.reindex(job.tenant))
        if reason:
            pipe.set(keys.reindex_failed(job.tenant, job.job), reason, ex=FAILED_TTL_S)

    return while_building(client, job.tenant, job.job, queue) is not None


def reindex_failure(client: Redis, tenant: str, job: str) -> str | None:
    """Why reindex ``job`` was abandoned, if it was (and said why)."""
    raw = client.get(keys.reindex_failed(tenant, job))
    return as_str(raw) if raw else None


def stage_vectors(
    client: Redis,
    tenant: str,
    job: str,
    batch: int,
    vectors: dict[str, bytes],
    then: NextBatch | None = None,
) -> bool | None:
    """Store one built batch of reindex ``job``, and record ``then``, the batch it sends
    next (:func:`next_batch`), in the outbox in the same transaction; True when it was the
    last one missing. A vector a writer staged meanwhile (newer content) is kept. None,
    storing nothing, when the job is no longer the one building (superseded or finished)."""
    now_ms = redis_now_ms(client) if then is not None else 0

    def queue(pipe: Any, current: ReindexJob) -> None:
        for cap_id, vector in vectors.items():
            pipe.hsetnx(keys.vectors(tenant, current.staging), cap_id, vector)
        if then is not None:
            args = then.args(current)
            outbox.record(pipe, then.task_id(current), keys.TASK_REINDEX_BATCH, args, None, now_ms)
            pipe.hdel(keys.reindex_plan(tenant, job), then.number)
        pipe.sadd(keys.reindex_done(tenant, job), batch)
        pipe.scard(keys.reindex_done(tenant, job))

    written = while_building(client, tenant, job, queue)
    return None if written is None else int(written[1][-1]) >= written[0].batches


def while_building(
    client: Redis, tenant: str, job: str, queue: Callable[[Any, ReindexJob], None]
) -> tuple[ReindexJob, list[Any]] | None:
    """Run the writes ``queue(pipe, current job)`` adds to a transaction only while ``job`` is
    still the one building ``tenant`` (its marker unchanged from the read to the write): the
    job and the results, or None when it is not. Its staging space is deleted when it is
    superseded, abandoned or swapped in; written after that, it stayed in Redis for good."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.reindex(tenant))  # type: ignore[no-untyped-call]
                current = ReindexJob.read(pipe, tenant)
                if current is None or current.job != job:
                    return None
                pipe.multi()
                queue(pipe, current)
                return current, pipe.execute()
            except redis.WatchError:
                continue


def finish_reindex(
    client: Redis, tenant: str, job: str, embed: Callable[[list[Capability]], dict[str, bytes]]
) -> int | None:
    """Swap reindex ``job`` in: once every stored capability has a staging vector (``embed``
    makes the missing ones), rename the staging vectors over the target space, serve the
    target, bump the version and tell discovery workers to reload, in one transaction. Returns
    the new version, or None when ``job`` is no longer the one building. A stored value that is
    no record (:data:`~capdisc.registry.policy.UNREADABLE`) cannot be embedded: it is tried
    once and swapped in without a vector, as it was served before (not tried for ever)."""
    watched = (keys.caps(tenant), keys.reindex(tenant), keys.version(tenant), keys.space(tenant))
    tried: set[str] = set()
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(*watched)  # type: ignore[no-untyped-call]
                current = ReindexJob.read(pipe, tenant)
                if current is None or current.job != job:
                    return None
                missing = [cap_id for cap_id in _unstaged(pipe, current) if cap_id not in tried]
                if missing:
                    pipe.unwatch()
                    _stage_missing(client, current, missing, embed)
                    tried.update(missing)  # a writer stages what it changes from now on
                    continue
                version = _swap(pipe, current)
                pipe.execute()
                return version
            except redis.WatchError:
                continue


def _unstaged(pipe: Any, job: ReindexJob) -> list[str]:
    stored = {as_str(k) for k in pipe.hkeys(keys.caps(job.tenant))}
    staged = {as_str(k) for k in pipe.hkeys(keys.vectors(job.tenant, job.staging))}
    return sorted(stored - staged)


def _stage_missing(
    client: Redis,
    job: ReindexJob,
    missing: list[str],
    embed: Callable[[list[Capability]], dict[str, bytes]],
) -> None:
    raw = client.hmget(keys.caps(job.tenant), missing)
    capabilities = [c for r in raw if (c := stored_capability(r)) is not None]
    vectors = embed(capabilities) if capabilities else {}

    def queue(pipe: Any, current: ReindexJob) -> None:
        for cap_id, vector in vectors.items():
            pipe.hsetnx(keys.vectors(job.tenant, current.staging), cap_id, vector)

    while_building(client, job.tenant, job.job, queue)


def _swap(pipe: Any, job: ReindexJob) -> int:
    """Read what the swap needs (still watching), then queue it as one transaction."""
    tenant = job.tenant
    old = pipe.get(keys.space(tenant))
    stored = {as_str(k) for k in pipe.hkeys(keys.caps(tenant))}
    staged = {as_str(k) for k in pipe.hkeys(keys.vectors(tenant, job.staging))}
    orphans = sorted(staged - stored)
    version = int(pipe.get(keys.version(tenant)) or 0) + 1
    pipe.multi()
    if orphans:
        pipe.hdel(keys.vectors(tenant, job.staging), *orphans)
    # the vectors replaced are unlinked, not left to RENAME: Redis frees them in the background
    pipe.unlink(keys.vectors(tenant, job.target))
    if staged & stored:  # else no staging vectors to rename (every stored value unreadable)
        pipe.rename(keys.vectors(tenant, job.staging), keys.vectors(tenant, job.target))
    if old and as_str(old) != job.target:
        pipe.unlink(keys.vectors(tenant, as_str(old)))
    pipe.set(keys.space(tenant), job.target)
    pipe.set(keys.version(tenant), version)
    pipe.delete(keys.reindex(tenant), keys.reindex_done(tenant, job.job))
    pipe.unlink(keys.reindex_plan(tenant, job.job))
    pipe.xadd(
        keys.CHANGES,
        {"tenant": tenant, "version": version, "op": "reload", "id": ""},
        maxlen=CHANGES_MAXLEN,
        approximate=True,
    )
    return version
