"""Giving freed heap memory back to the operating system after a large load.

Loading a tenant parses every record of it (JSON, vectors) before the index keeps its compact
form; glibc keeps most of that freed memory in its arenas, so the resident size would stay at
the load's peak. ``malloc_trim(0)`` returns it (about 2 KB per capability, measured with
``benchmarks/discovery_memory.py``). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any


@cache
def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
