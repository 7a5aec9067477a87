"""The one rule for a setting that is a duration (its name ends in ``_s`` or ``_ms``).

A duration is waited for by a thread (``threading.Event.wait``), given to Redis as an expiry,
or turned into whole milliseconds; each of these fails on infinity, NaN or a number past what
the platform holds (``wait(inf)`` raises ``OverflowError`` in the thread that waits, which
then dies while its process runs on). So every duration setting is finite and at most
:data:`MAX_SECONDS`; its own bounds (above 0, or 0 for "never") are its field's.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationInfo

#: The longest duration a setting may name: 366 days. Longer means "never" in practice; the
#: settings where "never" makes sense take 0 for it.
MAX_SECONDS = 366 * 86400
#: The suffixes of duration settings, and each one's units in a second.
UNITS = {"_s": 1, "_ms": 1000}


def duration_problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` for the setting ``name``, or None (also when ``name`` is
    not a duration or ``value`` not a number: its field's type says so)."""
    unit = next((UNITS[suffix] for suffix in UNITS if name.endswith(suffix)), None)
    if unit is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    limit = MAX_SECONDS * unit
    if math.isfinite(value) and value <= limit:
        return None
    unit_name, days = name.rsplit("_", 1)[1], MAX_SECONDS // 86400
    return f"must be a finite number of at most {limit} {unit_name} ({days} days), got {value}"


def bounded_duration(value: Any, info: ValidationInfo) -> Any:
    """A pydantic field validator for every field of a model (``field_validator("*")``):
    ``value`` unchanged, or ValueError saying :func:`duration_problem`."""
    problem = duration_problem(info.field_name or "", value)
    if problem:
        raise ValueError(problem)
    return value
