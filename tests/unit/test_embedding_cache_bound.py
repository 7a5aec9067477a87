"""When the shared embedding cache is due a prune: only once it outgrows the registry."""

from __future__ import annotations

import pytest

from capdisc_workers.embedding import (
    CACHE_ENTRIES_PER_CAPABILITY,
    CACHE_FLOOR_ENTRIES,
    cache_over_bound,
)


@pytest.mark.parametrize(
    ("entries", "capabilities", "due"),
    [
        (0, 0, False),
        (CACHE_FLOOR_ENTRIES, 0, False),
        (CACHE_FLOOR_ENTRIES + 1, 0, True),
        (CACHE_FLOOR_ENTRIES + 1, 10_000, False),
        (CACHE_ENTRIES_PER_CAPABILITY * 10_000, 10_000, False),
        (CACHE_ENTRIES_PER_CAPABILITY * 10_000 + 1, 10_000, True),
        (2 * 100_000, 100_000, False),
    ],
)
def test_a_cache_is_pruned_only_past_its_bound(entries: int, capabilities: int, due: bool) -> None:
    assert cache_over_bound(entries, capabilities) is due


@pytest.mark.parametrize(
    ("cache_keys", "in_use", "unused"),
    [
        ([], {"m"}, []),
        (["capdisc:emb:m"], {"m"}, []),
        (["capdisc:emb:old", "capdisc:emb:m"], {"m"}, ["capdisc:emb:old"]),
        (["capdisc:emb:a", "capdisc:emb:b"], {"a", "b"}, []),
        (["capdisc:emb:m.fs1"], {"m"}, ["capdisc:emb:m.fs1"]),
        (["capdisc:embx"], set(), []),
    ],
)
def test_only_the_caches_of_models_not_in_use_are_unused(
    cache_keys: list[str], in_use: set[str], unused: list[str]
) -> None:
    from capdisc_workers.embedding import unused_caches

    assert unused_caches(cache_keys, in_use) == unused
