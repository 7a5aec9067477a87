"""What an indexing worker embeds: the stored capabilities a reindex embeds again, and the
vectors of capabilities, made through the shared embedding cache in batches.

A capability's vector is :func:`capdisc.retrieval.text.combine` of the embeddings of its two
texts (:func:`capdisc.retrieval.text.embedding_texts`); each text's embedding is cached in Redis
by its hash, per embedder, so a text seen before (by any worker) is not embedded again.

:func:`ahead` runs such work on the process's one embedding thread, so that a worker embeds the
next events of a batch while it writes the previous ones to Redis (onnxruntime releases the GIL
while the model runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import redis

from capdisc import keys, status
from capdisc.embedders.port import Embedder, Vector, check_vectors
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.policy import stored_capability
from capdisc.registry.reindexstore import ReindexJob
from capdisc.registry.store import vector_bytes
from capdisc.retrieval.text import combine, embedder_id_of, embedding_texts, text_hash

#: Capabilities a reindex batch embeds again, and events per task the reconciler sends again.
EMBED_BATCH = 64
#: Texts per model call when a chunk of events needs many: a chunk's misses at once. The
#: local model splits a call into batches of 8 over its streams, and those wait for each other
#: at the call's end, so small calls idle the cores: measured on a 4,000-capability import
#: (``benchmarks/bulk_import.py``), 64-text calls left the cores 8.4 % idle during the import,
#: whole chunks 2.8 % (with the local model's batches run longest first). A remote embedder
#: splits a call to its API's own limits.
MODEL_CALL_TEXTS = 1024

#: Events whose vectors are made together (one forecast, one cache read, their misses sorted by
#: length into model calls) while the chunks before them are written to Redis. Also how many
#: events reach Redis back to back: each such burst costs every discovery worker a rebuild or
#: more of its whole index. Measured on a 10,000-capability import: 512 used 14 s less CPU
#: than 256 (less padding, half the rebuilds), 256 half the discovery CPU of 64.
APPLY_CHUNK = 512
#: The last chunk of a task is at most this long: the model has nothing to do while it is
#: written (the next task comes after it).
LAST_CHUNK = 64

_T = TypeVar("_T")
_thread: ThreadPoolExecutor | None = None
_thread_lock = threading.Lock()


def ahead(run: Callable[[], _T]) -> Future[_T]:
    """``run()`` on this process's embedding thread (started on first use), after what was
    given to it before: its result or error comes from the future. One thread, so one model
    call at a time, as from the worker's own thread."""
    global _thread
    with _thread_lock:
        if _thread is None:
            _thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capdisc-embedding")
        return _thread.submit(run)


def chunk_bounds(count: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each chunk of a task of ``count`` events: :data:`APPLY_CHUNK` each;
    past one chunk, the last one cut to at most :data:`LAST_CHUNK` (the rest goes before it)."""
    bounds = [(s, min(s + APPLY_CHUNK, count)) for s in range(0, count, APPLY_CHUNK)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] > LAST_CHUNK:
        start, end = bounds.pop()
        bounds += [(start, end - LAST_CHUNK), (end - LAST_CHUNK, end)]
    return bounds


def stored_capabilities(client: redis.Redis, refs: Iterable[tuple[str, str]]) -> list[Capability]:
    """The stored capabilities named by ``(tenant, capability id)`` (those still stored)."""
    out = []
    for tenant, cap_id in refs:
        capability = stored_capability(client.hget(keys.caps(tenant), cap_id))
        if capability is not None:
            out.append(capability)
    return out


def vectors_for(
    client: redis.Redis, embedder: Embedder, capabilities: list[Capability], use_cache: bool = True
) -> dict[str, tuple[str, bytes]]:
    """``(content hash, stored vector)`` by capability id. Each text's embedding comes from the
    shared cache (unless ``use_cache`` is off: a reindex that must not trust it); the misses of
    the whole batch are embedded together, :data:`MODEL_CALL_TEXTS` a model call, and refresh
    the cache."""
    if not capabilities:
        return {}
    texts = [embedding_texts(c) for c in capabilities]
    flat = list(dict.fromkeys(t for pair in texts for t in pair))
    digests = [text_hash(text) for text in flat]
    cached = (
        client.hmget(keys.embedding_cache(embedder.id), digests)
        if use_cache
        else [None] * len(flat)
    )
    rows = {
        text: np.frombuffer(raw, dtype=np.float32)
        for text, raw in zip(flat, cached, strict=True)
        if isinstance(raw, bytes)
    }
    missing = sorted(
        ((text, digest) for text, digest in zip(flat, digests, strict=True) if text not in rows),
        key=lambda pair: len(pair[0]),
    )  # less padding
    for start in range(0, len(missing), MODEL_CALL_TEXTS):
        _embed_chunk(client, embedder, missing[start : start + MODEL_CALL_TEXTS], rows)
    return {
        cap.id: (cap.content_hash, vector_bytes(combine(rows[full], rows[summary])))
        for cap, (full, summary) in zip(capabilities, texts, strict=True)
    }


def _embed_chunk(
    client: redis.Redis, embedder: Embedder, chunk: list[tuple[str, str]], rows: dict[str, Vector]
) -> None:
    """Embed ``(text, digest)`` pairs in one model call into ``rows`` and the cache."""
    fresh = check_vectors(
        embedder.embed([text for text, _d in chunk]), len(chunk), embedder.dim, embedder.id
    )
    with client.pipeline(transaction=False) as pipe:
        for (text, digest), vector in zip(chunk, fresh, strict=True):
            rows[text] = vector
            pipe.hset(keys.embedding_cache(embedder.id), digest, vector_bytes(vector))
        pipe.hincrby(keys.COUNTERS, "embedding_calls", len(chunk))
        pipe.execute()


# -- keeping the cache bounded ------------------------------------------------------------------

#: The shared cache is pruned once it holds more than this many entries per stored capability
#: (each has two texts; the third allows for one round of edits before any work is done) ...
CACHE_ENTRIES_PER_CAPABILITY = 3
#: ... and more than this many in all, so that a small registry is never pruned for a few edits.
CACHE_FLOOR_ENTRIES = 10_000
#: Cache fields deleted per command while pruning.
PRUNE_BATCH = 1000


def cache_over_bound(entries: int, capabilities: int) -> bool:
    """Whether a cache of ``entries`` texts for a registry of ``capabilities`` is due a prune."""
    return entries > max(CACHE_FLOOR_ENTRIES, CACHE_ENTRIES_PER_CAPABILITY * capabilities)


def prune_cache(client: redis.Redis, embedder_id: str, tenants: Iterable[str]) -> int | None:
    """Once the shared cache outgrows the registry (:func:`cache_over_bound`), delete every
    entry no stored capability of ``tenants`` embeds now (texts of edited or deleted ones);
    how many went, or None when it was within bounds. Safe beside imports: an entry written
    meanwhile and deleted here is only embedded again when next needed."""
    tenants = list(tenants)
    cache = keys.embedding_cache(embedder_id)
    stored = sum(int(client.hlen(keys.caps(tenant))) for tenant in tenants)
    if not cache_over_bound(int(client.hlen(cache)), stored):
        return None
    live = _live_digests(client, tenants)
    stale = [field for field, _v in client.hscan_iter(cache, count=1000) if field not in live]
    for start in range(0, len(stale), PRUNE_BATCH):
        client.hdel(cache, *stale[start : start + PRUNE_BATCH])
    return len(stale)


def _live_digests(client: redis.Redis, tenants: list[str]) -> set[bytes]:
    """The cache keys of the texts every stored capability of ``tenants`` embeds."""
    live: set[bytes] = set()
    for tenant in tenants:
        for _cap_id, value in client.hscan_iter(keys.caps(tenant), count=1000):
            capability = stored_capability(value)
            if capability is not None:
                live.update(text_hash(text).encode() for text in embedding_texts(capability))
    return live


# -- the caches of models no longer used --------------------------------------------------------


def unused_caches(cache_keys: Iterable[str], in_use: set[str]) -> list[str]:
    """The keys among ``cache_keys`` (:func:`capdisc.keys.embedding_cache`) of embedders that
    are not ``in_use``."""
    prefix = keys.embedding_cache("")
    return sorted(k for k in cache_keys if k.startswith(prefix) and k[len(prefix) :] not in in_use)


def embedders_in_use(client: redis.Redis, own: str, tenants: Iterable[str]) -> set[str]:
    """The embedders whose cache may still be read: ``own``, every worker's that has a
    heartbeat (live, or gone less than ``worker_forget_after_s`` ago), every tenant's served
    space's and every building reindex's target's."""
    in_use = {own}
    for entry in status.read_heartbeats(client).values():
        if isinstance(entry, dict) and isinstance(entry.get("embedder"), str):
            in_use.add(entry["embedder"])
    for tenant in tenants:
        space = client.get(keys.space(tenant))
        job = ReindexJob.read(client, tenant)
        for served in (as_str(space) if space else None, job.target if job else None):
            if served:
                in_use.add(embedder_id_of(served))
    return in_use


def drop_unused_caches(client: redis.Redis, in_use: set[str]) -> list[str]:
    """Delete the shared caches of embedders not ``in_use`` (:func:`embedders_in_use`): after a
    move to another model the old one's cache is read by no one, and only the cache of the
    model in use is pruned (:func:`prune_cache`). Their keys. Safe if wrong: a cache only
    saves embedding again."""
    found = (as_str(k) for k in client.scan_iter(match=f"{keys.embedding_cache('')}*", count=1000))
    gone = unused_caches(found, in_use)
    if gone:
        client.unlink(*gone)
    return gone
