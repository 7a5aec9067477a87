"""Typed settings, read once at the edge (a CLI command, a worker's entry point) and passed down.

Sources, later wins: the defaults below, a YAML settings file (``CAPDISC_SETTINGS_FILE`` or
``--settings``), then ``CAPDISC_*`` environment variables, read by :mod:`capdisc.rawsettings`.
Every field carries its unit in its name. Discovery fields live in :class:`DiscoveryConfig` and
can also be overridden per request. The fields a command needs to reach the stack can also be
read without building :class:`Settings` (:class:`~capdisc.rawsettings.ClientSettings`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from capdisc.discovery.config import DiscoveryConfig, Source, describe_invalid
from capdisc.durations import bounded_duration
from capdisc.errors import ConfigError
from capdisc.rawsettings import (
    DEFAULT_REDIS_URL,
    ENV_PREFIX,
    ClientSettings,
    environment_values,
    redis_url_problem,
    report_unknown_variables,
    settings_file_values,
    with_password_file,
)
from capdisc.rawsettings import SETTINGS_FILE_ENV as SETTINGS_FILE_ENV
from capdisc.rawsettings import mask_url as mask_url
from capdisc.rawsettings import with_password as with_password
from capdisc.sessions.policy import SessionPolicy
from capdisc.tenants import shown, tenant_problem


def setting_source(
    file_path: Path | None, file_keys: set[str], from_env: set[str], discovery_env: set[str]
) -> Source:
    """Where a setting at a location in :class:`Settings` was set: by its ``CAPDISC_*``
    variable (``from_env``, ``discovery_env``: the names set so), in the settings file
    (``file_path``, whose top-level keys are ``file_keys``) under its dotted name there, or
    nowhere (its default)."""

    def source(loc: tuple[str | int, ...]) -> tuple[str, str]:
        from_variable = (len(loc) == 1 and loc[0] in from_env) or (
            len(loc) == 2 and loc[0] == "discovery" and loc[1] in discovery_env
        )
        if from_variable:
            return str(loc[-1]), f"env {ENV_PREFIX}{str(loc[-1]).upper()}"
        where = f"settings file {file_path}" if loc[:1] and loc[0] in file_keys else "default"
        return ".".join(map(str, loc)), where

    return source


class Settings(BaseModel):
    """Everything a capdisc process needs to know about its environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: str = DEFAULT_REDIS_URL
    #: A file holding the Redis password (``capdisc up`` writes one, 0600): read at load and
    #: put into ``redis_url``, so the password is in no environment and no command line.
    redis_password_file: Path | None = None
    tenant: str = "default"
    #: Whether workers and ``capdisc mcp`` require signed identity tokens
    #: (:mod:`capdisc.identity.auth`)
    #: and take tenant, roles and user from them. Off: the identity a request claims is used
    #: (development only; workers warn at start). Unset: off, except under ``capdisc up``.
    auth: bool | None = None
    #: The keyring (JSON, key id -> key) tokens are verified with; read again when it changes.
    auth_keys_file: Path | None = None
    embedder: Literal["minilm", "hashing", "openai"] = "minilm"
    hashing_dim: int = Field(384, ge=8, le=4096)
    #: Let the MiniLM model's threads spin instead of sleeping: a fresh turn that reaches an
    #: idle worker about 3 ms faster, for about 55 ms more CPU a pass (docs/benchmarks.md).
    #: Only for a worker with cores of its own.
    model_spin: bool = False
    #: Threads a many-text MiniLM call (an import's chunk) runs its batches on at once, one
    #: core each (1: one stream, split over two threads as queries are): 167 against 147 texts
    #: a second on two cores (docs/benchmarks.md). About 110 MB more in a process that makes
    #: such calls (indexing workers; queries never do).
    model_streams: int = Field(2, ge=1, le=64)
    #: The OpenAI provider (``embedder: openai``): any OpenAI-compatible server via the URL.
    openai_model: str = "text-embedding-3-small"
    openai_base_url: str | None = None
    openai_api_key: str = Field("", repr=False)
    openai_dimensions: int = Field(1536, ge=1, le=8192)
    openai_request_dimensions: bool = True
    openai_batch_size: int = Field(512, ge=1, le=2048)
    openai_timeout_s: float = Field(30.0, gt=0)
    openai_max_attempts: int = Field(5, ge=1, le=20)
    query_cache_size: int = Field(4096, ge=0)
    #: How long a query's vectors stay in the cache shared by discovery workers (0: no sharing).
    query_cache_ttl_s: int = Field(86400, ge=0)
    #: At most this many turns' vectors are kept in that shared cache (the oldest are dropped;
    #: a one-request turn's vectors and their index entry take about 1.8 KB of Redis's memory,
    #: so 100,000 about 180 MB).
    query_cache_max_entries: int = Field(100_000, ge=1)
    #: When a discovery worker swaps in a tenant's next snapshot, the BM25 figures of this
    #: many query texts the one it replaces remembered last are computed for the new one on a
    #: thread of its own (a large tenant's busy queries then answer at once; 0: not warmed).
    warm_texts: int = Field(1024, ge=0)
    manifest_max_bytes: int = Field(64 * 1024, ge=256)
    event_max_bytes: int = Field(1024 * 1024, ge=1024)
    #: A producer sends its next indexing task only while fewer than this many of the tasks it
    #: sent wait for the indexing workers (its own: a full reindex's batches or another
    #: producer's never hold it up): a large import then goes at the workers' pace, and Redis
    #: holds about this many tasks' events per producer (each up to 1,024, kept twice: queue
    #: and outbox) instead of the whole import. A full reindex sends this many of its batches
    #: at the start and each built batch sends the next (at most this many wait). 0: no bound.
    publish_max_pending_tasks: int = Field(32, ge=0)
    #: The most of a dead letter's payload kept (UTF-8 bytes; ``capdisc dlq``): a longer
    #: event or request keeps only its start, marked with its whole size, and cannot be
    #: replayed (publish its source again). Bounds the memory a few huge ones hold in Redis;
    #: at least ``event_max_bytes`` keeps every event a worker accepts replayable.
    deadletter_payload_max_bytes: int = Field(1024 * 1024, ge=1024)
    #: The most bytes all dead letters hold together (their fields, as stored); past it the
    #: oldest go, counted (``capdisc status``: ``dead_letters_dropped``). With the entry cap
    #: alone, 100,000 letters of a MiB each could fill Redis. At least
    #: ``deadletter_payload_max_bytes``.
    deadletters_max_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    watch_debounce_ms: int = Field(500, ge=0)
    discover_timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    #: ``capdisc mcp``: how long a call forwarded to the MCP server a tool was imported from may
    #: take, connecting included, before it is cancelled and answered with a tool error.
    mcp_upstream_timeout_s: float = Field(30.0, gt=0)
    #: ``capdisc mcp``: the largest answer of an upstream server passed on to the host (as
    #: JSON); a larger one is a tool error saying to ask for less. No model reads more text in
    #: one turn, and a host that gets tens of MB may stall or fail. A stdio server's answer is
    #: not read past this (the rest of the line is skipped).
    mcp_max_result_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    #: ``capdisc mcp``: the token an upstream's changed tools are re-imported with (``write``
    #: grant, with auth on); None: the process's token (``--token``, ``CAPDISC_TOKEN``).
    mcp_import_token: str | None = Field(None, repr=False)
    #: A request read by a discovery worker and not answered for this long is served by
    #: another (the first one died or hangs); well above a turn's worst time.
    claim_idle_ms: int = Field(10_000, ge=100)
    reply_ttl_s: int = Field(60, ge=1)
    heartbeat_interval_s: float = Field(2.0, gt=0)
    #: A worker whose last heartbeat is older is taken for gone (its tasks are given back):
    #: at least twice ``heartbeat_interval_s``.
    worker_stale_after_s: float = Field(10.0, gt=0, validate_default=True)
    #: A worker whose last heartbeat is older than this (killed, or its host gone) is forgotten
    #: by the sweep, so ``capdisc:workers`` holds the workers of the last hour, not every one
    #: that ever ran; one still running is listed again at its next heartbeat.
    worker_forget_after_s: float = Field(3600.0, gt=0)
    #: ``capdisc up``: a child's log (``.capdisc/logs/NAME.log``, ``.capdisc/redis/redis.log``)
    #: past this size is copied to ``NAME.log.1`` and emptied, so each child's logs take at most
    #: about twice this on disk however long the stack runs.
    up_log_max_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    #: Where a worker serves Prometheus metrics (``/metrics``); None: not served, 0: any free
    #: port (logged as ``metrics_serving``; in the heartbeat: ``capdisc status --json``).
    #: Metrics name tenants: keep the host private (127.0.0.1 by default; 0.0.0.0 inside a
    #: container).
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    task_time_limit_s: int = Field(300, ge=1)
    visibility_timeout_s: int = Field(3600, ge=1)
    indexing_max_attempts: int = Field(5, ge=1)
    #: First wait before redelivering an event whose embedding failed; doubles, capped at 60 s.
    indexing_retry_base_s: float = Field(2.0, gt=0)
    #: How often one indexing worker of the fleet compares the registry with the index and
    #: repairs drift (0: never on its own; ``capdisc reconcile`` still runs it).
    reconcile_interval_s: float = Field(60.0, ge=0)
    #: How long a sent indexing task may be neither queued nor delivered before the reconciler
    #: takes it for lost by the broker and sends it again (:mod:`capdisc.registry.outbox`).
    outbox_grace_s: float = Field(10.0, ge=0)
    #: A task sent again and again for this long that no indexing worker takes (a task name
    #: the workers do not know: a producer newer than them) is given up: dead-lettered with
    #: its reason and no longer sent (long enough for a rolling upgrade of the workers).
    outbox_give_up_s: float = Field(3600.0, gt=0)
    #: How often one live indexing worker gives the queue back the tasks held by workers that
    #: are gone (delivered longer than ``outbox_grace_s`` ago, held by no live worker) and
    #: re-sends the tasks the broker lost: a dead worker's tasks run again within seconds, not
    #: after the visibility timeout (0: only the reconciler re-sends lost tasks).
    sweep_interval_s: float = Field(5.0, ge=0)
    #: A full reindex still building after this long is abandoned by the reconciler (its
    #: staging vectors dropped, the live index untouched); run it again.
    reindex_timeout_s: float = Field(6 * 3600.0, gt=0)
    #: A delete's tombstone (which stops an older upsert still in flight from bringing the
    #: capability back) is forgotten by the reconciler this long after the delete was applied,
    #: so a registry with churn does not keep every id it ever deleted. An event older than
    #: this (a dead letter replayed, a queue left unserved for longer) may bring back a
    #: capability deleted since; publish its source again to correct it.
    tombstone_horizon_s: float = Field(7 * 86400.0, gt=0)
    #: What discovery does with a capability the tool-poisoning scan flagged
    #: (:mod:`capdisc.registry.flags`): ``flag`` serves it marked, ``warn`` also puts a caution
    #: in its text, and ``quarantine`` serves it only once approved (``capdisc approve ID``).
    #: A tenant's own policy (``capdisc policy set --tenant T POLICY``, kept in Redis)
    #: overrides this.
    poisoning_policy: Literal["flag", "warn", "quarantine"] = "warn"
    #: Where discovery searches: the in-process index built from Redis ("redis"), or Weaviate
    #: ("weaviate": indexing workers also write every change there, discovery workers search it
    #: per turn; Redis stays the source of truth).
    vector_store: Literal["redis", "weaviate"] = "redis"
    #: Weaviate (:mod:`capdisc.vectorstores.weaviate`): REST URL (None: not configured), gRPC host
    #: (None: the URL's host) and port, API key, collection, and per-call timeouts.
    weaviate_url: str | None = None
    weaviate_grpc_host: str | None = None
    weaviate_grpc_port: int = Field(50051, ge=1, le=65535)
    weaviate_api_key: str = Field("", repr=False)
    weaviate_collection: str = Field("Capability", pattern=r"^[A-Z][_0-9A-Za-z]*$")
    weaviate_timeout_init_s: float = Field(5.0, gt=0)
    weaviate_timeout_query_s: float = Field(10.0, gt=0)
    weaviate_timeout_insert_s: float = Field(60.0, gt=0)
    #: Where discovery workers keep snapshots of the indexes they built (one directory per
    #: tenant and vector space, :mod:`capdisc.discovery.snapshotfile`), so a worker that starts
    #: or reloads after a gap maps one instead of building from Redis again; None or empty:
    #: off. ``capdisc up`` uses ``.capdisc/snapshots``. It may be shared by the workers of a
    #: host; nothing in it is unpickled.
    snapshot_dir: Path | None = None
    #: Snapshots kept per tenant and vector space (the newest; older ones are removed).
    snapshot_keep: int = Field(2, ge=1, le=100)
    #: A tenant's snapshot is written at most this often (its newest version then; the first
    #: one a worker builds at once), off the request path and once its graph is built. Writing
    #: one of 100,000 capabilities takes about 4 s of a core; a restart applies the changes
    #: made since the snapshot it finds.
    snapshot_interval_s: float = Field(300.0, ge=0)
    #: With ``snapshot_dir`` set, a tenant of at least this many capabilities loaded whole from
    #: Redis is built by a short-lived child process, which writes it as a snapshot the worker
    #: then maps (:mod:`capdisc_workers.buildapart`): the load's transient objects never stay
    #: in the serving process (at 100,000: 494 MB resident instead of about 900 MB). Changes to
    #: such a tenant are applied by the same kind of child, from the snapshot on disk, and the
    #: result mapped: the worker never holds two indexes at once. 0: always built and changed
    #: in the worker.
    map_above: int = Field(20_000, ge=0)
    #: How long that child may take before the worker builds the tenant (or applies the
    #: changes) itself.
    build_apart_timeout_s: float = Field(600.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    #: Sessions, loop and redundant-search guards, agent profiles (the settings file's
    #: ``sessions:`` section).
    sessions: SessionPolicy = Field(default_factory=SessionPolicy)

    @field_validator("snapshot_dir", mode="before")
    @classmethod
    def _no_snapshot_dir(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    _bounded_duration = field_validator("*")(bounded_duration)

    @field_validator("worker_stale_after_s")
    @classmethod
    def _beats_before_stale(cls, value: float, info: ValidationInfo) -> float:
        beat_s = info.data.get("heartbeat_interval_s")
        if beat_s is not None and value < 2 * beat_s:
            raise ValueError(
                f"must be at least twice heartbeat_interval_s ({beat_s} s), or live workers are "
                "taken for gone between heartbeats (their tasks run twice); raise it or lower "
                "heartbeat_interval_s"
            )
        return value

    @field_validator("deadletters_max_bytes")
    @classmethod
    def _room_for_one_letter(cls, value: int, info: ValidationInfo) -> int:
        payload = info.data.get("deadletter_payload_max_bytes")
        if payload is not None and value < payload:
            raise ValueError(
                f"must be at least deadletter_payload_max_bytes ({payload}), or one large dead "
                "letter drops every other; raise it or lower deadletter_payload_max_bytes"
            )
        return value

    @field_validator("sessions")
    @classmethod
    def _profile_options(cls, value: SessionPolicy) -> SessionPolicy:
        """Each agent profile's discovery options are valid ones (else every turn of that
        profile would fail, and the agent be blamed)."""
        for name, profile in value.profiles.items():
            try:
                DiscoveryConfig.model_validate(profile.options)
            except ValidationError as exc:
                raise ValueError(
                    f"agent profile {name!r}, options: {describe_invalid(exc, 'discovery option')}"
                ) from None
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        problem = redis_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        problem = tenant_problem(value)
        if problem:
            raise ValueError(f"{shown(value)} {problem}")
        return value

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, path: Path | None = None) -> Settings:
        """Defaults, then the settings file, then ``CAPDISC_*`` variables."""
        env = os.environ if environ is None else environ
        file_path, values = settings_file_values(env, path)
        file_keys = set(values)
        discovery = values.pop("discovery", None) or {}
        if not isinstance(discovery, dict):
            raise ConfigError(
                f"settings file {file_path}: 'discovery' must be a mapping of discovery options"
            )
        discovery = dict(discovery)
        names = [name for name in cls.model_fields if name not in ("discovery", "sessions")]
        from_env = environment_values(env, names)
        discovery_env = environment_values(env, DiscoveryConfig.model_fields)
        report_unknown_variables(env, [*names, *DiscoveryConfig.model_fields])
        values.update(from_env)
        discovery.update(discovery_env)
        values["discovery"] = discovery
        try:
            settings = cls.model_validate(values)
        except ValidationError as exc:
            where = setting_source(file_path, file_keys, set(from_env), set(discovery_env))
            raise ConfigError(describe_invalid(exc, "setting", cls, where)) from exc
        return settings.with_password_file()

    def with_changes(self, **changes: Any) -> Settings:
        """The settings with ``changes`` (a command's options), checked as at load."""
        try:
            return Settings.model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            raise ConfigError(describe_invalid(exc, "setting", Settings)) from exc

    def with_password_file(self) -> Settings:
        """The settings with ``redis_password_file``'s password in ``redis_url`` (a URL that
        names a password already keeps its own)."""
        url = with_password_file(self.redis_url, self.redis_password_file)
        return self if url == self.redis_url else self.with_changes(redis_url=url)

    def client_settings(self) -> ClientSettings:
        """The fields a command needs to reach the stack (what
        :meth:`ClientSettings.load <capdisc.rawsettings.ClientSettings.load>` reads)."""
        return ClientSettings(**{f.name: getattr(self, f.name) for f in fields(ClientSettings)})

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (mask_url(value) if name == "redis_url" else value)
