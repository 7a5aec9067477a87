"""Redis replies as text: a client made without ``decode_responses`` answers bytes, one made
with it answers str, and the readers of keys, ids and fields take either."""

from __future__ import annotations

from typing import Any


def as_str(value: Any) -> str:
    """``value`` (bytes or anything else a Redis reply holds) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
