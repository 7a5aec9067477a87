"""The compact capability table: records read back whole, columns without parsing, deltas
that copy what they keep."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc import captable
from capdisc.access import Caller
from capdisc.captable import (
    PARSED_CACHE,
    CapabilityTable,
    IdRows,
    PackedStrings,
    decode,
    dense_strings,
    encode,
    table_arrays,
    table_from_arrays,
)
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.filters import NO_FILTERS
from capdisc.models import Capability, Relationship, SourceRef, Visibility


def capability(n: int, **changes: object) -> Capability:
    base = Capability(
        id=f"tool:t{n}",
        kind="tool",
        name=f"t{n}",
        description=f"Does thing number {n}, with ünïcode and \u4e2d\u6587.",
        category=f"c{n % 3}",
        tags=("a", "b"),
        full_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        source_ref=SourceRef(type="mcp", source="mcp:srv", location="srv"),
        relationships=(Relationship(target="tool:t0", type="depends_on"),),
        example_queries=("do it",),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


CAPS = [capability(n) for n in range(6)]


@pytest.mark.parametrize(
    "cap",
    [
        CAPS[0],
        capability(1, visibility=Visibility(roles=("ops",))),
        capability(2, full_schema=None, full_content="# A skill\n" * 50, kind="skill"),
        capability(3, available=False, has_side_effects=True),
    ],
)
def test_a_record_decodes_to_the_capability_it_encodes(cap: Capability) -> None:
    assert decode(encode(cap)) == cap


def test_a_record_is_smaller_than_its_json() -> None:
    cap = capability(1, description="Search the web for pages about a topic. " * 4)
    assert len(encode(cap)) < len(repr(cap.to_dict()).encode()) / 2


def test_a_table_reads_each_capability_by_id_and_by_row() -> None:
    table = CapabilityTable.of(CAPS)

    assert list(table) == [c.id for c in CAPS]
    assert [table[c.id] for c in CAPS] == CAPS
    assert list(table.by_row) == CAPS
    assert "tool:t9" not in table and "tool:t2" in table


def test_a_repeated_id_keeps_the_first_row_and_the_last_capability() -> None:
    newer = capability(1, description="newer")
    table = CapabilityTable.of([*CAPS[:3], newer])

    assert table.ids == tuple(c.id for c in CAPS[:3])
    assert table["tool:t1"] == newer


def test_the_columns_match_the_capabilities() -> None:
    caps = [capability(0), capability(1, available=False, visibility=Visibility(users=("u",)))]
    table = CapabilityTable.of(caps)

    assert table.names == ("t0", "t1")
    assert [table.category(r) for r in range(2)] == ["c0", "c1"]
    assert table.available.tolist() == [True, False]
    assert table.open.tolist() == [True, False]
    assert not table.all_open


def test_visible_rows_are_the_open_ones_and_the_callers_own() -> None:
    caps = [
        capability(0),
        capability(1, visibility=Visibility(users=("ann",))),
        capability(2, visibility=Visibility(roles=("ops",))),
    ]
    table = CapabilityTable.of(caps)

    assert table.visible_rows(Caller(user="ann")) == [0, 1]
    assert table.visible_rows(Caller(roles=frozenset({"ops"}))) == [0, 2]


def test_a_change_replaces_in_place_appends_new_ids_and_drops_deleted_ones() -> None:
    table = CapabilityTable.of(CAPS)
    edited = capability(2, description="edited")
    added = capability(9)

    changed, sources = table.changed([edited, added], ["tool:t4"])

    assert changed.ids == ("tool:t0", "tool:t1", "tool:t2", "tool:t3", "tool:t5", "tool:t9")
    assert sources == [0, 1, -1, 3, 5, -2]
    assert changed["tool:t2"] == edited and changed["tool:t9"] == added
    assert changed["tool:t5"] == CAPS[5]
    assert changed.record(1) == table.record(1)  # kept records are copied as they are
    assert changed.names[-1] == "t9" and changed.category(2) == "c2"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 11), max_size=6),
    st.lists(st.integers(0, 11), max_size=6),
    st.sampled_from(["c0", "c1", "new"]),
    st.booleans(),
    st.integers(0, 8),
)
def test_a_changed_table_equals_the_table_made_afresh_of_the_same_capabilities(
    upserted: list[int], deleted: list[int], category: str, hidden: bool, size: int
) -> None:
    before = [capability(n, category=f"c{n % 2}") for n in range(size)]
    upserts = [
        capability(n, category=category, available=not hidden, description=f"v{n}")
        for n in upserted
    ]
    deletes = [f"tool:t{n}" for n in deleted]
    expected = {c.id: c for c in before if c.id not in deletes or c.id in {u.id for u in upserts}}
    expected.update({c.id: c for c in upserts})

    changed, _ = CapabilityTable.of(before).changed(upserts, deletes)
    afresh = CapabilityTable.of(expected.values())

    assert changed.ids == afresh.ids and changed.names == afresh.names
    assert [changed.record(r) for r in range(len(changed))] == [
        afresh.record(r) for r in range(len(afresh))
    ]
    assert changed.category_values == afresh.category_values
    assert changed.category_codes.tolist() == afresh.category_codes.tolist()
    assert changed.available.tolist() == afresh.available.tolist()
    assert changed.open.tolist() == afresh.open.tolist()


def test_an_upsert_of_a_deleted_id_is_kept() -> None:
    changed, _ = CapabilityTable.of(CAPS).changed([capability(1, name="x")], ["tool:t1"])

    assert changed["tool:t1"].name == "x"


def test_the_parsed_cache_holds_at_most_its_size() -> None:
    table = CapabilityTable.of(capability(n) for n in range(PARSED_CACHE + 10))

    first = table.row(0)
    assert table.row(0) is first  # read again: from the cache
    for row in range(1, PARSED_CACHE + 10):
        table.row(row)
    assert table.row(0) == first and table.row(0) is not first  # dropped, parsed again


def test_a_table_survives_its_arrays() -> None:
    table = CapabilityTable.of(CAPS)

    again = table_from_arrays(table_arrays(table))

    assert list(again.by_row) == CAPS
    assert again.names == table.names and again.available.tolist() == table.available.tolist()


def test_arrays_of_another_format_are_refused() -> None:
    arrays = table_arrays(CapabilityTable.of(CAPS))
    arrays["json"] = dict(arrays["json"], format="zstd-9")

    with pytest.raises(ValueError, match="format 'zstd-9'"):
        table_from_arrays(arrays)


def test_columns_that_disagree_with_the_records_are_refused() -> None:
    arrays = table_arrays(CapabilityTable.of(CAPS))
    one = arrays["names.offsets"][:2]  # the first name only
    arrays["names.offsets"], arrays["names.blob"] = one, arrays["names.blob"][: one[-1]]

    with pytest.raises(ValueError, match="6 ids has 6 records, 1 names"):
        table_from_arrays(arrays)


def test_a_delta_parses_none_of_the_capabilities_it_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedder = HashingEmbedder()
    caps = [capability(n) for n in range(40)]
    vectors = embedder.embed([c.description for c in caps])
    snapshot = IndexSnapshot.build(
        "t",
        1,
        vectors.shape[1],
        zip(caps, (v.tobytes() for v in vectors), strict=True),
        embedder.id,
    )
    parsed: list[int] = []
    real = captable.decode
    monkeypatch.setattr(captable, "decode", lambda record: parsed.append(1) or real(record))
    edited = capability(3, description="Sends the weather by email.")

    vector = embedder.embed([edited.description])[0]

    changed = snapshot.with_changes(2, [(edited, vector.tobytes())], ["tool:t7"])

    assert parsed == []
    assert changed.capabilities["tool:t3"] == edited and "tool:t7" not in changed.capabilities
    assert (
        changed.retriever.search(  # type: ignore[attr-defined]
            "weather by email",
            embedder.embed(["weather by email"])[0],
            1,
            NO_FILTERS,
            DiscoveryConfig(),
        )
        .hits[0]
        .id
        == "tool:t3"
    )


def test_dense_strings_are_equal_copies_in_order() -> None:
    items = ["tool:a", "b", "", "ünï"]

    assert dense_strings(items) == items
    assert dense_strings(["a\x00b", "c"]) == ["a\x00b", "c"]  # the separator inside: as they are


@given(st.lists(st.text(max_size=40), max_size=30))
def test_packed_strings_read_back_each_string_as_given(strings: list[str]) -> None:
    packed = PackedStrings.of(strings)

    assert len(packed) == len(strings)
    assert list(packed) == strings
    assert [packed[-1 - i] for i in range(len(strings))] == strings[::-1]


def test_packed_strings_refuse_a_row_past_their_end() -> None:
    with pytest.raises(IndexError, match="row 2 of 2"):
        PackedStrings.of(["a", "b"])[2]


@pytest.mark.parametrize(
    ("blob", "offsets"),
    [
        (b"abc", [1, 3]),  # not from 0
        (b"abc", [0, 2]),  # short of the bytes
        (b"abc", [0, 2, 1, 3]),  # going back
        (b"", []),  # no offsets at all
    ],
)
def test_packed_strings_refuse_offsets_that_do_not_fit_their_bytes(
    blob: bytes, offsets: list[int]
) -> None:
    with pytest.raises(ValueError, match="packed strings"):
        PackedStrings(np.frombuffer(blob, dtype=np.uint8), np.asarray(offsets, dtype=np.int64))


@given(
    st.lists(st.text(max_size=12), max_size=20),
    st.lists(st.integers(min_value=-3, max_value=25), max_size=30),
)
def test_packed_strings_picked_are_the_kept_rows_and_the_new_ones(
    strings: list[str], picks: list[int]
) -> None:
    packed = PackedStrings.of(strings)
    picks = [p for p in picks if p < len(strings)] if strings else [p for p in picks if p < 0]
    news = {row: f"new-{row}" for row, p in enumerate(picks) if p < 0}

    picked = packed.picked(np.asarray(picks, dtype=np.int64), news)

    assert list(picked) == [news[row] if p < 0 else strings[p] for row, p in enumerate(picks)]


def test_id_rows_find_each_id_and_refuse_others() -> None:
    ids = PackedStrings.of(["tool:a", "tool:b", "skill:c"])
    rows = IdRows.of(ids)

    assert [rows[i] for i in ("tool:a", "tool:b", "skill:c")] == [0, 1, 2]
    assert "tool:d" not in rows and rows.get("tool:d") is None
    assert list(rows) == ["tool:a", "tool:b", "skill:c"]


def test_id_rows_answer_alike_once_their_recent_ids_are_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(captable, "RECENT_IDS", 2)
    names = [f"tool:t{n}" for n in range(5)]
    rows = IdRows.of(PackedStrings.of(names))

    assert [rows[i] for i in names * 2] == [*range(5), *range(5)]
    assert len(rows._recent) <= 2


def test_id_rows_check_a_hash_found_against_the_id_at_its_row() -> None:
    ids = PackedStrings.of(["tool:a", "tool:b"])
    colliding = np.asarray([7, 7], dtype=np.uint64)  # both ids given one hash
    rows = IdRows(ids, colliding, np.asarray([1, 0], dtype=np.int32))
    original = captable.id_hash
    try:
        captable.id_hash = lambda _text: 7  # type: ignore[assignment]
        assert (rows["tool:a"], rows["tool:b"]) == (0, 1)
        assert "tool:c" not in rows
    finally:
        captable.id_hash = original


def test_a_table_refuses_an_id_twice() -> None:
    with pytest.raises(ValueError, match="holds an id twice: tool:a"):
        IdRows.of(PackedStrings.of(["tool:a", "tool:b", "tool:a"]))
