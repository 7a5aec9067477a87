"""structlog configuration: JSON lines (or a console rendering) with bound context.

Call :func:`configure_logging` once per process at its entry point. Bind context with
``structlog.contextvars.bind_contextvars(request_id=..., tenant=...)`` or ``log.bind(...)``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    handler = _handler(renderer, stream)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)


def _handler(renderer: Any, stream: Any = None) -> logging.Handler:
    """A stdlib handler rendering each record (structlog's or a library's) with ``renderer``."""
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
    return handler


@contextmanager
def settings_warnings_as_json(stream: Any = None) -> Iterator[None]:
    """While the settings are read, before a process's logging is set up: what reading them
    warns of (``capdisc.settings``: an unknown ``CAPDISC_*`` variable) is written as a JSON
    line, as the rest of a worker's log, not as Python's plain fallback line. Nothing global
    is configured (the module that reads them may be imported by other programs)."""
    logger = logging.getLogger("capdisc.settings")
    handler = _handler(structlog.processors.JSONRenderer(), stream)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


class Throttle:
    """How often one kind of warning that anyone can cause (a refused token, a malformed
    request) is written: the first ``per_window`` of each ``window_s``, then none until the next
    window, whose first line says how many were left out (so a flood of bad requests cannot
    fill the disk with log lines, and its size is still told). ``clock`` is monotonic seconds."""

    def __init__(
        self,
        per_window: int = 100,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        self._started = -float("inf")
        self._written = 0
        self._left_out = 0

    def admit(self) -> int | None:
        """None when this one is not written; else how many were left out before it."""
        now = self.clock()
        if now - self._started >= self.window_s:
            self._started, self._written = now, 0
        if self._written >= self.per_window:
            self._left_out += 1
            return None
        self._written += 1
        left_out, self._left_out = self._left_out, 0
        return left_out
