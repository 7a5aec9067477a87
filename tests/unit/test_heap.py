"""Giving freed heap memory back after a large load: a no-op where the C library cannot."""

from __future__ import annotations

import gc
import platform

import pytest

from capdisc_workers.heap import collection_paused, release_freed_memory


def test_freed_memory_is_returned_on_glibc_and_never_raises() -> None:
    released = release_freed_memory()
    assert released is (platform.libc_ver()[0] == "glibc")


def test_the_collector_is_paused_inside_and_runs_again_after() -> None:
    with collection_paused():
        inside = gc.isenabled()
        with collection_paused():
            nested = gc.isenabled()
        after_nested = gc.isenabled()

    assert (inside, nested, after_nested, gc.isenabled()) == (False, False, False, True)


def test_a_collector_switched_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_runs_again_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("a failed load")

    assert gc.isenabled()
