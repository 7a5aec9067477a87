"""The Celery application of the indexing workers, and the one place they read their environment.

``celery -A capdisc_workers.celery_app worker`` imports this module, and importing it calls
:func:`from_environment` once: it loads :class:`~capdisc.settings.Settings` (the ``CAPDISC_*``
variables), builds the worker's :class:`~capdisc_workers.resources.Resources` from them and
configures the app. The task modules (:data:`TASK_MODULES`) take ``app`` and ``resources`` from
here; nothing else reads the environment.

When neither ``CAPDISC_REDIS_URL`` nor the settings name a Redis, the app joins the stack that
``capdisc up`` runs from the current directory or a parent (its ``.capdisc/stack.json``, as the
``capdisc`` command finds it): so ``celery -A capdisc_workers.celery_app inspect ping`` run in
the project asks that stack's indexing workers, not a Redis at port 6379.

Configured for reliable indexing over Redis: late acks with re-queue on a lost worker, prefetch
of one, a visibility timeout far above the hard time limit, JSON only, no result storage (events
are fire-and-forget; outcomes go to acks lists and the changes stream).

Run: ``celery -A capdisc_workers.celery_app worker -Q indexing -P solo``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis
import structlog
from celery import Celery, signals

from capdisc import keys
from capdisc.errors import CapdiscError
from capdisc.logs import configure_logging, settings_warnings_as_json
from capdisc.rawsettings import celery_broker_url
from capdisc.settings import Settings
from capdisc.stackfile import joining_stack
from capdisc_workers.queueguard import REFUSE_OPTION, TRANSPORT, Refuse
from capdisc_workers.resources import Resources

#: The modules whose tasks and signal handlers the worker loads.
TASK_MODULES = [
    "capdisc_workers.indexing",
    "capdisc_workers.reindexing",
    "capdisc_workers.reconciling",
    "capdisc_workers.liveness",
]


def create_app(settings: Settings, refuse_entry: Refuse | None = None) -> Celery:
    """The indexing workers' app; ``refuse_entry`` is told of each queue entry that is no
    message (:mod:`capdisc_workers.queueguard`), which the worker then skips."""
    broker = celery_broker_url(settings.redis_url, TRANSPORT)
    celery = Celery("capdisc", broker=broker, include=TASK_MODULES)
    celery.conf.update(
        task_default_queue=keys.INDEXING_QUEUE,
        task_routes={"capdisc.indexing.*": {"queue": keys.INDEXING_QUEUE}},
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_time_limit=settings.task_time_limit_s,
        task_soft_time_limit=max(1, settings.task_time_limit_s - 10),
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        # Redis going away (a restart) never ends the worker: reconnect for as long as it takes
        broker_connection_max_retries=None,
        # kombu's Redis transport, refusing a queue entry that is no message instead of ending
        broker_transport=TRANSPORT,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            REFUSE_OPTION: refuse_entry,
        },
    )
    celery.conf.capdisc_settings = settings
    return celery


def from_environment(
    environ: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[Celery, Resources]:
    """The app and the worker's resources, from the settings the environment gives, joining
    the running stack found from ``cwd`` when they name no Redis (a missing or broken keyring
    with auth on stops the worker here, at start)."""
    environ = os.environ if environ is None else environ
    settings = joining_stack(Settings.load(environ), environ, cwd or Path.cwd())
    resources = Resources.from_settings(settings)
    return create_app(resources.settings, _refuser(resources)), resources


def _refuser(resources: Resources) -> Refuse:
    """Log a queue entry that is no message and keep it in the dead letters."""
    log = structlog.get_logger("capdisc.indexing")

    def refuse(queue: str, entry: str, reason: str) -> None:
        log.error(
            "queue_entry_refused",
            queue=queue,
            reason=reason,
            hint=f"something other than a capdisc producer wrote to the list {queue!r} of this "
            "Redis database; the entry was skipped and kept in the dead letters "
            "(capdisc dlq list)",
        )
        try:
            resources.dead_letter(resources.redis, entry, f"not a queue message: {reason}")
        except redis.RedisError as exc:
            log.warning("queue_entry_not_kept", queue=queue, error=str(exc))

    return refuse


def _started() -> tuple[Celery, Resources]:
    """:func:`from_environment`, or, when the settings stop the worker (a malformed setting, a
    missing keyring or API key), one line saying why (not Celery's "Unable to load celery
    application" and a traceback) and exit 2."""
    try:
        with settings_warnings_as_json():
            return from_environment()
    except CapdiscError as exc:
        configure_logging()
        structlog.get_logger("capdisc.indexing").error("worker_not_started", reason=str(exc))
        sys.exit(2)


app, resources = _started()


@signals.setup_logging.connect
def _setup_logging(**_: Any) -> None:
    configure_logging(resources.settings.log_level, resources.settings.log_format)
    if not resources.gate.enabled:
        structlog.get_logger("capdisc.indexing").warning(
            "auth_off",
            hint="events are applied whoever sent them: anyone who can reach Redis "
            "can write the registry; set CAPDISC_AUTH=on and CAPDISC_AUTH_KEYS_FILE outside "
            "development",
        )
