"""The Celery application of the indexing workers.

Configured for reliable indexing over Redis: late acks with re-queue on a lost worker, prefetch
of one, a visibility timeout far above the hard time limit, JSON only, no result storage (events
are fire-and-forget; outcomes go to acks lists and the changes stream). Settings are read once,
here, at the edge.

Run: ``celery -A capdisc_workers.celery_app worker -Q indexing -P solo``
"""

from __future__ import annotations

from typing import Any

import structlog
from celery import Celery, signals

from capdisc import keys
from capdisc.identity.gate import Gate
from capdisc.logs import configure_logging
from capdisc.settings import Settings


def create_app(settings: Settings) -> Celery:
    celery = Celery("capdisc", broker=settings.redis_url, include=["capdisc_workers.indexing"])
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
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
    )
    celery.conf.capdisc_settings = settings
    return celery


settings = Settings.load()
app = create_app(settings)
#: Who may write: with auth on, an event is applied only if its token grants ``write`` on its
#: tenant (a missing or broken keyring stops the worker here, at start).
gate = Gate.from_settings(settings)


@signals.setup_logging.connect
def _setup_logging(**_: Any) -> None:
    configure_logging(settings.log_level, settings.log_format)
    if not gate.enabled:
        structlog.get_logger("capdisc.indexing").warning(
            "auth_off", hint="events are applied whoever sent them: anyone who can reach Redis "
            "can write the registry; set CAPDISC_AUTH=on and CAPDISC_AUTH_KEYS_FILE outside "
            "development")
