"""Giving freed heap memory back after a large load: a no-op where the C library cannot."""

from __future__ import annotations

import platform

from capdisc_workers.heap import release_freed_memory


def test_freed_memory_is_returned_on_glibc_and_never_raises() -> None:
    released = release_freed_memory()
    assert released is (platform.libc_ver()[0] == "glibc")
