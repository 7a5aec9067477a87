"""A full reindex of one tenant, blue/green: the tasks that build every vector again into a
staging space beside the live index and swap it in.

``capdisc reindex --all`` sends :func:`start_reindex_task`, which records the job and sends
:func:`reindex_batch_task` for its first batches of capabilities (``publish_max_pending_tasks``
of them; each built batch sends the next of its lane), shared by the indexing workers; the batch
that completes the job swaps it in (:func:`capdisc.registry.reindexstore.finish_reindex`) and,
with an external vector store, writes the tenant there again
(:func:`capdisc_workers.mirroring.resync`). The storage side is
:mod:`capdisc.registry.reindexstore`.
"""

from __future__ import annotations

from typing import Any

import structlog

from capdisc import keys
from capdisc.errors import EmbeddingError
from capdisc.models import Capability
from capdisc.registry import outbox
from capdisc.registry.policy import retry_delay_s
from capdisc.registry.reindexstore import (
    NextBatch,
    ReindexJob,
    abandon_reindex,
    all_built,
    batch_built,
    begin_reindex,
    finish_reindex,
    next_batch,
    stage_vectors,
)
from capdisc.retrieval.text import vector_space
from capdisc_workers.celery_app import app, resources
from capdisc_workers.embedding import EMBED_BATCH, stored_capabilities, vectors_for
from capdisc_workers.mirroring import resync
from capdisc_workers.resources import Resources

log = structlog.get_logger("capdisc.indexing")


@app.task(name=keys.TASK_START_REINDEX, bind=True, acks_late=True, ignore_result=True)
def start_reindex_task(self: Any, tenant: str, job: str, fresh: bool = False) -> dict[str, Any]:
    """Build every vector of ``tenant`` again, into a staging space beside the live index, in
    batches other indexing workers share; the last batch swaps it in (:func:`finish_reindex`)."""
    res = resources
    target = vector_space(res.embedder.id)
    window = res.settings.publish_max_pending_tasks
    batches = begin_reindex(res.redis, tenant, job, target, EMBED_BATCH, fresh, window)
    if batches is None:
        # delivered again after the job was swapped in, abandoned or superseded
        log.info("reindex_start_redelivered", tenant=tenant, job=job, task_id=self.request.id)
        return {"job": job, "batches": 0, "target": target, "skipped": "begun already"}
    current = ReindexJob.read(res.redis, tenant)
    log.info(
        "reindex_started",
        tenant=tenant,
        job=job,
        target=target,
        batches=current.batches if current else len(batches),
        sent=len(batches),
        task_id=self.request.id,
    )
    for number, ids in batches.items():
        outbox.send(res.redis, app, keys.TASK_REINDEX_BATCH, [tenant, job, number, ids])
    if current is not None and current.job == job and all_built(res.redis, current):
        _finish(res, tenant, job, fresh)  # nothing to build, or every batch built already
    return {"job": job, "batches": len(batches), "target": target}


@app.task(name=keys.TASK_REINDEX_BATCH, bind=True, acks_late=True, ignore_result=True)
def reindex_batch_task(
    self: Any, tenant: str, job: str, number: int, ids: list[str]
) -> dict[str, Any]:
    """Embed one batch of a full reindex into its staging space."""
    res = resources
    client = res.redis
    current = ReindexJob.read(client, tenant)
    if current is None or current.job != job:
        return {"job": job, "batch": number, "skipped": "superseded"}
    if current.target != vector_space(res.embedder.id):
        # a worker with another embedder (a fleet mid-rollout): leave it to one that matches
        raise self.retry(
            countdown=retry_delay_s(self.request.retries + 1, res.settings.indexing_retry_base_s),
            max_retries=res.settings.indexing_max_attempts - 1,
        )
    built, every = batch_built(client, current, number)
    if built:  # delivered again: it sent the next of its lane when it was staged
        if every:
            _finish(res, tenant, job, current.fresh)
        return {"job": job, "batch": number, "skipped": "built already"}
    try:
        capabilities = stored_capabilities(client, [(tenant, cap_id) for cap_id in ids])
        vectors = vectors_for(client, res.embedder, capabilities, use_cache=not current.fresh)
        staged = {k: v for k, (_h, v) in vectors.items()}
        if _stage_and_send_next(res, current, number, staged):
            _finish(res, tenant, job, current.fresh)
    except EmbeddingError as exc:
        return _retry_or_abandon(self, res, current, number, exc)
    return {"job": job, "batch": number, "staged": len(vectors)}


def _stage_and_send_next(
    res: Resources, job: ReindexJob, number: int, vectors: dict[str, bytes]
) -> bool:
    """Stage batch ``number``'s vectors with the next batch of its lane recorded beside them,
    then send that one; whether it was the last batch missing."""
    then = next_batch(res.redis, job, number)
    if then is not None:
        report_damaged(job, then)
    last = stage_vectors(res.redis, job.tenant, job.job, number, vectors, then)
    if last is not None and then is not None:
        outbox.publish(app, then.task_id(job), keys.TASK_REINDEX_BATCH, then.args(job))
    return bool(last)


def report_damaged(job: ReindexJob, batch: NextBatch) -> None:
    """Log ``batch``'s plan entry if it could not be read (the batch goes out empty)."""
    if batch.problem:
        log.error(
            "reindex_plan_damaged",
            tenant=job.tenant,
            job=job.job,
            batch=batch.number,
            problem=batch.problem,
            hint="that batch is sent empty; the swap embeds what it would have held",
        )


def _retry_or_abandon(
    task: Any, res: Resources, job: ReindexJob, number: int, exc: EmbeddingError
) -> dict[str, Any]:
    """A batch whose embedding failed is retried with backoff up to ``indexing_max_attempts``
    deliveries; then the reindex is abandoned with the reason (the live index is untouched),
    not left building until ``reindex_timeout_s`` with the reconciler holding off the tenant."""
    attempt = task.request.retries + 1
    settings = res.settings
    if attempt < settings.indexing_max_attempts:
        log.warning(
            "reindex_batch_retry",
            tenant=job.tenant,
            job=job.job,
            batch=number,
            attempt=attempt,
            reason=str(exc),
        )
        raise task.retry(
            exc=exc,
            countdown=retry_delay_s(attempt, settings.indexing_retry_base_s),
            max_retries=settings.indexing_max_attempts - 1,
        )
    reason = f"batch {number} could not be embedded after {attempt} attempts: {exc}"
    abandon_reindex(res.redis, job, reason)  # unless another reindex superseded it meanwhile
    log.error(
        "reindex_abandoned",
        tenant=job.tenant,
        job=job.job,
        reason=reason,
        hint="the live index is untouched; run `capdisc reindex --all` again once the "
        "embedder answers",
    )
    return {"job": job.job, "batch": number, "abandoned": reason}


def _finish(res: Resources, tenant: str, job: str, fresh: bool) -> None:
    def embed(capabilities: list[Capability]) -> dict[str, bytes]:
        made = vectors_for(res.redis, res.embedder, capabilities, use_cache=not fresh)
        return {k: v for k, (_h, v) in made.items()}

    version = finish_reindex(res.redis, tenant, job, embed)
    log.info("reindex_swapped", tenant=tenant, job=job, index_version=version)
    if version is not None:
        resync(res.redis, res.store, tenant, vector_space(res.embedder.id))
