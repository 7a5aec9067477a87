"""structlog configuration: JSON lines (or a console rendering) with bound context.

Call :func:`configure_logging` once per process at its entry point. Bind context with
``structlog.contextvars.bind_contextvars(request_id=..., tenant=...)`` or ``log.bind(...)``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]


#: Libraries that log every index build at DEBUG (and set their own logger's level when
#: imported, so a level set here would not hold): only their warnings get through.
_CHATTY = ("bm25s",)


def _quiet_chatty_libraries(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.split(".")[0] not in _CHATTY


#: Tracebacks as data, without each frame's local variables: those would put secrets (a
#: token being checked, a password being read) and whole capability records into the logs.
_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def configure_logging(level: str = "INFO", fmt: str = "json", stream: Any = None) -> None:
    """Route structlog and stdlib logging (Celery's too) through one renderer on ``stream``."""
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        # filter_by_level first: a debug event in a per-turn path costs nothing at INFO.
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _TRACEBACKS,
                renderer,
            ],
        )
    )
    handler.addFilter(_quiet_chatty_libraries)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
