"""Reading a large Redis hash a piece at a time (HSCAN), for readers that need not hold it
whole and must not hold Redis with one long command."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

#: Fields one HSCAN of a full read asks for. Each holds Redis a millisecond or so; one HGETALL
#: of a 100,000-capability tenant held every other client for 0.3-1.1 s and made Redis buffer
#: the whole reply (``benchmarks/redis_full_read.py``).
SCAN_COUNT = 256


def scan_pieces(client: Any, key: str, count: int = SCAN_COUNT) -> Iterator[dict[Any, Any]]:
    """Hash ``key`` a piece (about ``count`` fields and their values) at a time, as HSCAN
    returns it: for a reader that need not hold it whole. A field may come in two pieces."""
    cursor = 0
    while True:
        cursor, piece = client.hscan(key, cursor, count=count)
        yield cast("dict[Any, Any]", piece)  # a list only with no_values
        if cursor == 0:
            return
