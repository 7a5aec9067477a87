"""How a tenant's record counts move with each record written (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from capdisc.registry.counts import deltas
from capdisc.registry.policy import UNREADABLE, StoredRecord


def _record(kind: str, source: str = "dir") -> StoredRecord:
    capability = {"id": f"{kind}:x", "kind": kind, "source_ref": {"source": source}}
    return StoredRecord(capability, 1, "hash", 0)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, _record("tool"), {"kind:tool": 1, "source:dir": 1}),
        (_record("tool"), None, {"kind:tool": -1, "source:dir": -1}),
        (_record("tool"), _record("tool"), {}),  # rewritten as it was
        (_record("tool"), _record("skill"), {"kind:tool": -1, "kind:skill": 1}),
        (_record("tool", "a"), _record("tool", "b"), {"source:a": -1, "source:b": 1}),
        (UNREADABLE, _record("tool"), {"unreadable": -1, "kind:tool": 1, "source:dir": 1}),
        (UNREADABLE, None, {"unreadable": -1}),
    ],
)
def test_a_written_record_moves_the_counts_of_its_kind_and_source(
    before: StoredRecord | None, after: StoredRecord | None, expected: dict[str, int]
) -> None:
    assert deltas([(before, after)]) == Counter(expected)


def test_the_writes_of_one_transaction_add_up() -> None:
    first, second = _record("tool"), _record("skill")

    moved = deltas([(None, first), (first, second), (None, _record("tool", "other"))])

    assert moved == Counter({"kind:skill": 1, "kind:tool": 1, "source:dir": 1, "source:other": 1})
