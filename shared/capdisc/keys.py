"""The one documented home of every Redis key, stream, queue and Celery task name.

Key schema (``{t}`` is a tenant name, ``{m}`` an embedder id):

========================================  =======  ===============================================
key                                       type     what it holds
========================================  =======  ===============================================
``capdisc:tenants``                       set      every tenant that has ever been written to
``capdisc:t:{t}:caps``                    hash     capability id -> stored record (JSON)
``capdisc:t:{t}:tombstones``              hash     capability id -> sequence of the delete
                                                   (forgotten tombstone_horizon_s after it)
``capdisc:t:{t}:tombstoned_at``           zset     capability id -> when its delete was applied
                                                   (Redis's clock, ms); the reconciler drops the
                                                   tombstones older than tombstone_horizon_s
``capdisc:t:{t}:vectors:{m}``             hash     capability id -> float32 vector bytes
``capdisc:t:{t}:version``                 string   monotonic index version (INCR)
``capdisc:t:{t}:space``                   string   the vector space discovery serves (``{m}`` and
                                                   text scheme); set by the first write and by a
                                                   full reindex's swap
``capdisc:t:{t}:reindex``                 hash     the full reindex being built: job, target
                                                   space, batches, fresh, started_at_ms
``capdisc:t:{t}:reindex:{job}:done``      set      batch numbers of that reindex already built
``capdisc:t:{t}:reindex:{job}:failed``    string   why that reindex was abandoned (expires)
``capdisc:t:{t}:vectors:{m}~{job}``       hash     the reindex's staging vectors (renamed over
                                                   the live ones at the swap)
``capdisc:t:{t}:source:{h}``             set      ids of the capabilities stored from one source
                                                   (``{h}``: a hash of the source's name)
``capdisc:t:{t}:synclock:{h}``           string   held (SET NX, expiring) by the producer
                                                   planning and sending a sync of that source
``capdisc:s:{t}:{s}``                     hash     session ``{s}``: ``state`` (working set and
                                                   guard memory, JSON) and ``rev`` (its revision);
                                                   expires max_age_s after creation; outside
                                                   ``capdisc:t:*``, so no grant on a tenant's
                                                   registry keys reaches a session, whatever its id
``capdisc:s:{t}:{s}~events~{k}``          stream   every change to that working set, in order;
                                                   ``{k}``: a keyed hash of ``{t}`` and ``{s}``
                                                   (SESSIONS_SECRET), told by a discovery worker
                                                   to a watcher its token lets watch
``capdisc:s:{t}:{s}~req:{r}``             string   the outcome of request ``{r}`` in that session
                                                   (a retry returns it; expires request_memory_s);
                                                   ``~`` is in no session or request id, so no
                                                   session's key is another's
``capdisc:s:{t}~live``                    zset     live session ids by last activity (bounded;
                                                   expires max_age_s after the last of them)
``capdisc:t:{t}:manifest_errors``         hash     manifest path -> last rejection message
``capdisc:t:{t}:repair``                  list     records a reconcile run found without a vector
                                                   and left for later (JSON lists of ids, a task
                                                   each), sent as the repair window drains (by
                                                   each repair task done, and the sweep);
                                                   replaced by every run; expires after a day
``capdisc:t:{t}:store_unwritten``         hash     capability id -> why the external vector store
                                                   did not take its last change (the reconciler
                                                   writes it again; gone once a write succeeds)
``capdisc:t:{t}:flags``                   hash     capability id -> its tool-poisoning flag (JSON:
                                                   findings, surface_hash, scanner_version,
                                                   state flagged|pending|approved,
                                                   approved_surface_hash); only flagged ones,
                                                   written with the record, gone with it
``capdisc:t:{t}:poisoning_policy``        string   the tenant's policy (flag, warn, quarantine);
                                                   absent: the workers' ``poisoning_policy``
``capdisc:emb:{m}``                       hash     sha256 of embedding text -> vector bytes (cache;
                                                   pruned, and deleted once no tenant, reindex
                                                   or worker uses model ``{m}``)
``capdisc:qv:{sha}``                      string   a turn's query and sub-query vectors, shared by
                                                   discovery workers (expires: query_cache_ttl_s)
``capdisc:qv:index``                      zset     sha -> when its vectors were stored (s, Redis's
                                                   clock); the oldest are dropped past
                                                   query_cache_max_entries
``capdisc:changes``                       stream   one entry per applied change: tenant, version,
                                                   op, id (discovery workers follow it)
``capdisc:deadletters``                   stream   events that could not be applied, with reason;
                                                   also discovery requests refused or quarantined
                                                   (``source``: the requests stream); capped
                                                   at DEADLETTERS_MAXLEN entries and
                                                   ``deadletters_max_bytes``, oldest first
``capdisc:deadletters:budget``            hash     ``bytes``: what the dead letters' fields hold;
                                                   ``dropped``: letters the bounds dropped
``capdisc:acks:{batch}``                  list     per-event outcome for a publish batch (expires)
``capdisc:counters``                      hash     embedding_calls and other running totals
``capdisc:workers``                       hash     worker id -> heartbeat (JSON); the sweep
                                                   forgets one silent for worker_forget_after_s
``capdisc:outbox``                        hash     task id -> indexing task sent and not yet done
                                                   (JSON: name, args, kwargs, sent_at_ms)
``capdisc:served``                        stream   each discovery worker's swaps: worker, tenant,
                                                   version, at_ms (capped)
``capdisc:reconcile:lock``                string   held by the indexing worker reconciling now
``capdisc:reconcile:last``                string   the last reconciler report (JSON)
``capdisc:discovery:requests``            stream   per-turn discovery requests (consumer group;
                                                   capped near DISCOVERY_REQUESTS_MAXLEN)
``capdisc:reply:{request_id}``            list     the reply to one request (expires)
``capdisc:sessions:secret``               string   a random secret set (NX) by the first discovery
                                                   worker to write a session event: it names the
                                                   session event streams (discovery workers only)
``capdisc:epoch``                         string   a random id set (NX) by the first discovery
                                                   worker to find it missing: when it changes or
                                                   vanishes, Redis lost its data (workers reload)
``capdisc:supervised``                    hash     child name (indexing, discovery, redis) ->
                                                   what ``capdisc up`` knows of it (JSON: pid,
                                                   restarts, last_exit, last_restart_ms,
                                                   updated_ms); rewritten every few seconds
``indexing``                              list     the Celery queue of registry events (kombu)
``unacked``                               hash     kombu's delivered, not yet acknowledged tasks
``unacked_index``                         zset     kombu's delivery tag -> delivery time (s)
``capdisc:sweep:lock``                    string   held by the indexing worker sweeping orphaned
                                                   deliveries and lost tasks now
========================================  =======  ===============================================
"""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "capdisc"

#: Celery queue that carries registry events to indexing workers.
INDEXING_QUEUE = "indexing"
#: kombu's Redis transport keeps delivered, unacknowledged messages here (its default name).
KOMBU_UNACKED = "unacked"
#: kombu's index of :data:`KOMBU_UNACKED`: delivery tag scored by delivery time (seconds).
KOMBU_UNACKED_INDEX = "unacked_index"
#: Held (SET NX with expiry) by the indexing worker sweeping orphaned deliveries now.
SWEEP_LOCK = f"{PREFIX}:sweep:lock"
#: Celery task that applies one registry event. Producers send it by this name.
TASK_APPLY_EVENT = "capdisc.indexing.apply_event"
#: Celery task that applies a batch of registry events, embedding them in one model call.
TASK_APPLY_EVENTS = "capdisc.indexing.apply_events"
#: Celery task that starts a full (blue/green) reindex of one tenant.
TASK_START_REINDEX = "capdisc.indexing.start_reindex"
#: Celery task that builds one batch of a full reindex's staging vectors.
TASK_REINDEX_BATCH = "capdisc.indexing.reindex_batch"
#: Celery task that compares the registry with the index and repairs drift.
TASK_RECONCILE = "capdisc.indexing.reconcile"

#: Stream of per-turn discovery requests, read by discovery workers in one consumer group.
DISCOVERY_REQUESTS = f"{PREFIX}:discovery:requests"
#: About how many entries :data:`DISCOVERY_REQUESTS` holds at most: clients trim it as they add
#: (approximately, whole stream nodes). Workers delete each entry they answer, so it holds only
#: requests not yet answered; while no discovery worker runs, clients keep asking (again every
#: ``resend_after_s``) and, uncapped, would fill Redis's memory, the registry's too. At the cap
#: the oldest requests, long past their deadline, go first.
DISCOVERY_REQUESTS_MAXLEN = 100_000
#: Consumer group of the discovery workers on :data:`DISCOVERY_REQUESTS`.
DISCOVERY_GROUP = "discovery-workers"
#: Stream of applied registry changes (hot reload).
CHANGES = f"{PREFIX}:changes"
#: Stream of events that could not be applied.
DEADLETTERS = f"{PREFIX}:deadletters"
#: How many dead letters are kept at most (trimmed as they are added, oldest first): a client
#: sending malformed requests in a loop must not fill Redis's memory with them.
DEADLETTERS_MAXLEN = 100_000
#: Hash of what the dead letters hold against their byte budget: ``bytes`` and ``dropped``
#: (:mod:`capdisc.registry.deadletters`).
DEADLETTERS_BUDGET = f"{DEADLETTERS}:budget"
#: Hash of running totals (``embedding_calls``).
COUNTERS = f"{PREFIX}:counters"
#: Hash of worker heartbeats.
WORKERS = f"{PREFIX}:workers"
#: Set of tenant names.
TENANTS = f"{PREFIX}:tenants"
#: Hash of indexing tasks sent and not yet done (:mod:`capdisc.registry.outbox`).
OUTBOX = f"{PREFIX}:outbox"
#: Stream of the index versions each discovery worker swapped in (capped).
SERVED = f"{PREFIX}:served"
#: Held (SET NX with expiry) by the one indexing worker running the periodic reconciler.
RECONCILE_LOCK = f"{PREFIX}:reconcile:lock"
#: The last reconciler report (JSON), shown by ``capdisc status``.
RECONCILE_LAST = f"{PREFIX}:reconcile:last"
#: String: this Redis's data generation, a random id set once (SET NX); a discovery worker that
#: sees it change or vanish knows Redis lost its data and reloads what is published again.
EPOCH = f"{PREFIX}:epoch"
#: String: the random secret that names each session's event stream (made, SET NX, by the first
#: discovery worker that writes one; readable by discovery workers only): without it, nobody can
#: name another tenant's or session's stream, and Redis's client role may read only streams.
SESSIONS_SECRET = f"{PREFIX}:sessions:secret"
#: Hash: child name -> JSON state of a process ``capdisc up`` supervises (pid, restarts, last
#: exit); ``capdisc status`` shows it.
SUPERVISED = f"{PREFIX}:supervised"


def caps(tenant: str) -> str:
    """Hash: capability id -> stored record JSON."""
    return f"{PREFIX}:t:{tenant}:caps"


def tombstones(tenant: str) -> str:
    """Hash: capability id -> the sequence number of the delete that removed it."""
    return f"{PREFIX}:t:{tenant}:tombstones"


def tombstone_times(tenant: str) -> str:
    """Sorted set: tombstoned capability id -> when its delete was applied (ms, Redis's clock);
    what :mod:`capdisc.registry.tombstones` forgets old tombstones by."""
    return f"{PREFIX}:t:{tenant}:tombstoned_at"


def vectors(tenant: str, embedder_id: str) -> str:
    """Hash: capability id -> float32 vector bytes made by ``embedder_id``."""
    return f"{PREFIX}:t:{tenant}:vectors:{embedder_id}"


def version(tenant: str) -> str:
    """String: the tenant's monotonic index version."""
    return f"{PREFIX}:t:{tenant}:version"


def space(tenant: str) -> str:
    """String: the vector space the tenant is served from
    (:func:`capdisc.retrieval.text.vector_space`)."""
    return f"{PREFIX}:t:{tenant}:space"


def reindex(tenant: str) -> str:
    """Hash: the full reindex of ``tenant`` being built (absent when none is)."""
    return f"{PREFIX}:t:{tenant}:reindex"


def reindex_done(tenant: str, job: str) -> str:
    """Set: the batch numbers of reindex ``job`` already built."""
    return f"{PREFIX}:t:{tenant}:reindex:{job}:done"


def reindex_plan(tenant: str, job: str) -> str:
    """Hash: batch number -> JSON list of capability ids, for the batches of reindex ``job``
    not sent yet (each is sent by the batch before it in its lane, then leaves the hash)."""
    return f"{PREFIX}:t:{tenant}:reindex:{job}:plan"


def reindex_plan_draft(tenant: str, job: str, token: str) -> str:
    """Hash: a plan being written, renamed to :func:`reindex_plan` when its job is recorded
    (``token`` tells apart two starts of the job delivered at once); expires a day later."""
    return f"{PREFIX}:t:{tenant}:reindex:{job}:plan:{token}"


def reindex_begun(tenant: str, job: str) -> str:
    """String: reindex ``job`` was begun (a redelivery of its start continues it, or does
    nothing once it is done); expires a day later."""
    return f"{PREFIX}:t:{tenant}:reindex:{job}:begun"


def reindex_failed(tenant: str, job: str) -> str:
    """String: why reindex ``job`` was abandoned, for the ``capdisc reindex`` waiting on it."""
    return f"{PREFIX}:t:{tenant}:reindex:{job}:failed"


def staging_space(space_id: str, job: str) -> str:
    """The vector space a reindex ``job`` builds into, beside the live ``space_id``."""
    return f"{space_id}~{job}"


def record_counts(tenant: str) -> str:
    """Hash: ``kind:K`` and ``source:S`` -> how many records, ``unreadable``, and ``complete``
    (:mod:`capdisc.registry.counts`)."""
    return f"{PREFIX}:t:{tenant}:counts"


def record_counts_tried(tenant: str) -> str:
    """String with a TTL: a recount of the records was cut short by a write; the next waits."""
    return f"{PREFIX}:t:{tenant}:counts:tried"


def repair_backlog(tenant: str) -> str:
    """List: JSON lists of capability ids a reconcile run found without a vector and did not
    send yet (one task's worth each); sent as earlier repairs are embedded
    (:func:`capdisc_workers.reconciling.continue_repair`, and the sweep)."""
    return f"{PREFIX}:t:{tenant}:repair"


def source_ids(tenant: str, source: str) -> str:
    """Set: ids of the capabilities stored from ``source`` (a directory, jsonl:PATH, ...)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return f"{PREFIX}:t:{tenant}:source:{digest}"


def sync_lock(tenant: str, source: str) -> str:
    """String: held by the one producer planning and sending a sync of ``source`` now."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return f"{PREFIX}:t:{tenant}:synclock:{digest}"


#: Where every session's keys live: apart from the tenants' registry keys (``capdisc:t:``),
#: since a session id is chosen by its agent and may end like one of them (``x:caps``).
SESSIONS_PREFIX = f"{PREFIX}:s"
#: Where sessions (``...:session:{s}``) and each tenant's index of them (``...:sessions``)
#: lived before they had a prefix of their own (moved by
#: :func:`capdisc.sessions.store.move_legacy_sessions`; :func:`from_legacy_session_key` tells
#: them from other keys the pattern matches).
LEGACY_SESSION_MATCH = f"{PREFIX}:t:*:session*"


def session(tenant: str, session_id: str) -> str:
    """Hash: one session's ``state`` (JSON) and ``rev`` (revision, for compare-and-set)."""
    return f"{SESSIONS_PREFIX}:{tenant}:{session_id}"


def session_events(tenant: str, session_id: str, secret: str) -> str:
    """Stream: one session's working-set changes, named with a keyed hash of the tenant and
    session (``secret``: the value of :data:`SESSIONS_SECRET`)."""
    message = f"{tenant}\0{session_id}".encode()
    ticket = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:32]
    return f"{session(tenant, session_id)}~events~{ticket}"


def session_request(tenant: str, session_id: str, request_id: str) -> str:
    """String: the outcome of one request applied to a session (exactly-once effects)."""
    return f"{session(tenant, session_id)}~req:{request_id}"


def from_legacy_session_key(key: str) -> str | None:
    """The key a session's key written before :data:`SESSIONS_PREFIX` has now
    (``capdisc:t:{t}:session:{rest}`` -> ``capdisc:s:{t}:{rest}``, and the tenant's index of
    live sessions ``capdisc:t:{t}:sessions`` -> :func:`sessions`), or None for another key.
    A tenant name holds no ``:``, so the tenant is what comes before the first one."""
    under = key.removeprefix(f"{PREFIX}:t:")
    tenant, _, rest = under.partition(":")
    if under == key or not tenant:
        return None
    if rest == "sessions":
        return sessions(tenant)
    session_key = rest.removeprefix("session:")
    if session_key == rest or not session_key:
        return None
    return f"{SESSIONS_PREFIX}:{tenant}:{session_key}"


def sessions(tenant: str) -> str:
    """Sorted set: live session ids, scored by last activity (ms). (``~`` is in no tenant or
    session id, so no session's key is this one.)"""
    return f"{SESSIONS_PREFIX}:{tenant}~live"


def manifest_errors(tenant: str) -> str:
    """Hash: manifest path -> the message of its last rejection (cleared once it parses)."""
    return f"{PREFIX}:t:{tenant}:manifest_errors"


def store_unwritten(tenant: str) -> str:
    """Hash: capability id -> why the external vector store did not take its last change
    (written again by the reconciler; cleared once a write of it succeeds)."""
    return f"{PREFIX}:t:{tenant}:store_unwritten"


def flags(tenant: str) -> str:
    """Hash: capability id -> its tool-poisoning flag (:class:`capdisc.registry.flags.Flag`,
    JSON)."""
    return f"{PREFIX}:t:{tenant}:flags"


def poisoning_policy(tenant: str) -> str:
    """String: the tenant's tool-poisoning policy (``capdisc policy set``)."""
    return f"{PREFIX}:t:{tenant}:poisoning_policy"


def embedding_cache(embedder_id: str) -> str:
    """Hash: sha256 of an embedding text -> float32 vector bytes (shared by indexing workers)."""
    return f"{PREFIX}:emb:{embedder_id}"


#: Zset: each shared query-vector entry's digest -> when it was stored (seconds, Redis's
#: clock); the oldest are dropped once it holds more than ``query_cache_max_entries``.
QUERY_VECTORS_INDEX = f"{PREFIX}:qv:index"


def query_vectors(digest: str) -> str:
    """String: one turn's query and sub-query vectors (float32 rows), shared by discovery
    workers; ``digest`` hashes the embedder id and the texts. Expires."""
    return f"{PREFIX}:qv:{digest}"


def acks(batch_id: str) -> str:
    """List: one JSON outcome per applied event of a publish batch."""
    return f"{PREFIX}:acks:{batch_id}"


def reply(request_id: str) -> str:
    """List: the reply to one discovery request."""
    return f"{PREFIX}:reply:{request_id}"
