"""Hiding secrets in text that is kept or shown (dead letters, logs)."""

from __future__ import annotations

import re

#: A ``"token": "..."`` pair in JSON text (for :func:`redact_tokens`).
_TOKEN_VALUE = re.compile(r'("token"\s*:\s*)"(?:[^"\\]|\\.)*"')


def redact_tokens(text: str) -> str:
    """``text`` (a request's payload JSON, as kept for inspection) with every token value
    replaced: what may be stored or shown."""
    return _TOKEN_VALUE.sub(r'\1"[redacted]"', text)
