"""Heap handling around a large load: the cycle collector paused while it runs, and freed heap
memory given back to the operating system after it.

A load allocates millions of small objects that live on (records, schemas, names); each
allocation threshold reached runs the cycle collector over the ones made so far, again and
again, for objects that are not garbage. :func:`collection_paused` holds it off for the load;
it runs again when the load ends.

Loading a tenant parses every record of it (JSON, vectors) before the index keeps its compact
form; glibc keeps most of that freed memory in its arenas, so the resident size would stay at
the load's peak. ``malloc_trim(0)`` returns it (about 2 KB per capability, measured with
``benchmarks/discovery_memory.py``). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any


class _CollectorPause:
    """How many blocks hold the cycle collector off, and whether it ran before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = True


_pause = _CollectorPause()


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pause the cycle collector inside the block (nested and threaded uses count: it runs
    again when the last one ends, if it ran before the first)."""
    with _pause.lock:
        if _pause.depth == 0:
            _pause.was_enabled = gc.isenabled()
            gc.disable()
        _pause.depth += 1
    try:
        yield
    finally:
        with _pause.lock:
            _pause.depth -= 1
            if _pause.depth == 0 and _pause.was_enabled:
                gc.enable()


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
