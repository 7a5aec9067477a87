"""The capabilities of one snapshot held compactly: each record compressed in one shared buffer,
parsed into a :class:`~capdisc.models.Capability` only when it is read.

A discovery worker renders a handful of capabilities a turn, but holds every one of its
catalog. As Python objects a capability takes about 2.6 KB (its dicts, tuples and strings);
as its compact JSON compressed with a shared dictionary of the record's keys and common
schema words it takes about a quarter of its 800 bytes of JSON. The few fields read for every
capability (its name and category for Tier 0, whether it is available and open to the whole
tenant) are kept as columns beside the buffer, so nothing has to parse every record.

The table is immutable; :meth:`CapabilityTable.changed` makes the next one for a delta by
copying the compressed records it keeps (no record is parsed or compressed again). The
parsed capabilities most recently read are kept (:data:`PARSED_CACHE`), so the capabilities a
busy tenant's turns keep returning are parsed once.
"""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import pairwise
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from capdisc.access import Caller, visible
from capdisc.models import Capability

#: Parsed capabilities kept per table (least recently read dropped first): about 2.6 KB each,
#: so at most ~11 MB a table. Parsing one costs ~35 µs and a turn renders about five, so a
#: working set of a few hundred distinct turns (1,500 rows) must fit: 1,024 did not.
PARSED_CACHE = 4096
#: Ids whose rows a table's :class:`IdRows` keeps at hand (all forgotten when it fills).
RECENT_IDS = 4096
#: zlib level of the records: measured 215 bytes a record at 6 against 235 at 1, for 4 µs more.
LEVEL = 6
#: zlib's preset dictionary: the record's keys in their order and words most schemas use. It
#: is part of the stored format (a table written with another dictionary cannot be read), so
#: it only changes with :data:`FORMAT`.
DICTIONARY = (
    b'{"type":"object","properties":{"query":{"type":"string","description":"The "},'
    b'"limit":{"type":"integer","description":"Maximum number of "},"id":{"type":"number",'
    b'"description":" of the "},"enum":[],"items":{"type":"array","default":null}},'
    b'"required":[],"additionalProperties":false},"full_content":null,"source_ref":'
    b'{"type":"tool","location":"","source":"mcp:"},"relationships":[],"example_queries":[],'
    b'"version":"","visibility":{"roles":[],"users":[]}}{"id":"tool:","kind":"tool","name":"",'
    b'"display_name":"","description":"Get the ","category":"general","tags":[],'
    b'"required_secrets":[],"required_tools":[],"available":true,"has_side_effects":null,'
    b'"full_schema":'
)
#: The record encoding (compact JSON of ``Capability.to_dict``, raw deflate, :data:`DICTIONARY`).
FORMAT = "deflate-dict-1"

BoolArray = npt.NDArray[np.bool_]
Offsets = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]


def encode(capability: Capability) -> bytes:
    """One capability's stored record."""
    text = json.dumps(capability.to_dict(), separators=(",", ":"), ensure_ascii=False)
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
    return packer.compress(text.encode()) + packer.flush()


def decode(record: bytes | memoryview) -> Capability:
    """The capability of a record :func:`encode` made."""
    unpacker = zlib.decompressobj(-15, DICTIONARY)
    data = unpacker.decompress(record) + unpacker.flush()
    return Capability.from_dict(json.loads(data))


class CapabilityTable(Mapping[str, Capability]):
    """Capabilities by id, in row order, each parsed from its compressed record when read.

    ``rows`` maps ids to rows (shared with the retrieval index built over the table);
    :attr:`by_row` reads them by row. Iterating the mapping yields ids without parsing;
    ``values()`` parses every record, so per-turn code reads single capabilities or the
    columns (:attr:`names`, :meth:`category`, :attr:`available`, :attr:`open`).
    """

    def __init__(
        self,
        ids: PackedStrings,
        blob: bytes | Bytes,
        offsets: Offsets,
        names: PackedStrings,
        category_codes: npt.NDArray[np.int32],
        category_values: tuple[str, ...],
        available: BoolArray,
        open_rows: BoolArray,
        rows: IdRows | None = None,
    ) -> None:
        if not len(ids) + 1 == len(offsets) == len(names) + 1 == len(category_codes) + 1:
            raise ValueError(
                f"a capability table of {len(ids)} ids has {len(offsets) - 1} records, "
                f"{len(names)} names and {len(category_codes)} categories"
            )
        self.ids = ids
        self.rows = rows if rows is not None else IdRows.of(ids)
        if self.rows.ids is not ids:
            raise ValueError("a capability table's id rows are of other ids")
        self.blob = blob
        self.offsets = offsets
        self.names = names
        self.category_codes = category_codes
        self.category_values = category_values
        self.available = available
        self.open = open_rows
        self._view = (memoryview(blob) if isinstance(blob, bytes) else blob.data).cast("B")
        self._parsed: OrderedDict[int, Capability] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, capabilities: Iterable[Capability]) -> CapabilityTable:
        """The table of ``capabilities`` in their order (a repeated id: the later one wins, at
        the first one's row)."""
        latest: dict[str, Capability] = {}
        for capability in capabilities:
            latest[capability.id] = capability
        caps = list(latest.values())
        return _Columns.of(caps).table([encode(c) for c in caps])

    # -- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __getitem__(self, cap_id: str) -> Capability:
        return self.row(self.rows[cap_id])

    def row(self, row: int) -> Capability:
        """The capability at ``row``, parsed (or from the recently read ones)."""
        with self._lock:
            found = self._parsed.get(row)
            if found is not None:
                self._parsed.move_to_end(row)
                return found
        capability = decode(self.record(row))
        with self._lock:
            self._parsed[row] = capability
            if len(self._parsed) > PARSED_CACHE:
                self._parsed.popitem(last=False)
        return capability

    def record(self, row: int) -> memoryview:
        """The stored (compressed) record at ``row``."""
        return self._view[int(self.offsets[row]) : int(self.offsets[row + 1])]

    @property
    def by_row(self) -> RowView:
        """The capabilities as a sequence in row order (each parsed when read)."""
        return RowView(self)

    def category(self, row: int) -> str:
        return self.category_values[int(self.category_codes[row])]

    @property
    def all_open(self) -> bool:
        """Whether every capability is visible to the whole tenant."""
        return bool(self.open.all())

    def visible_rows(self, caller: Caller) -> list[int]:
        """Rows ``caller`` may see (only the restricted ones are parsed)."""
        return [
            row
            for row in range(len(self.ids))
            if self.open[row] or visible(self.row(row).visibility, caller)
        ]

    def stored_bytes(self) -> int:
        """Bytes the records take (compressed)."""
        return int(self.offsets[-1]) if len(self.offsets) else 0

    # -- changing -----------------------------------------------------------------------------

    def changed(
        self, upserts: Sequence[Capability], deletes: Iterable[str]
    ) -> tuple[CapabilityTable, list[int]]:
        """The next table: ``deletes`` gone, ``upserts`` replacing their id at its row or added
        at the end. Also, per row of the new table, its row here, or ``-1 - i`` for
        ``upserts[i]``. Kept records are copied a run of rows at a time, not parsed; the
        columns are moved as arrays (a delta costs no Python work per kept row)."""
        latest = {c.id: i for i, c in enumerate(upserts)}
        sources = np.arange(len(self.ids), dtype=np.int64)
        keep = np.ones(len(self.ids), dtype=bool)
        for cid, i in latest.items():
            if cid in self.rows:
                sources[self.rows[cid]] = -1 - i
        for cid in set(deletes) - latest.keys():
            if cid in self.rows:
                keep[self.rows[cid]] = False
        added = [-1 - i for cid, i in latest.items() if cid not in self.rows]
        picks = np.concatenate([sources[keep], np.asarray(added, dtype=np.int64)])
        if not len(self):  # no rows to copy from (a worker's empty first snapshot)
            return CapabilityTable.of(upserts[-1 - pick] for pick in added), picks.tolist()
        return self._picked(picks, upserts), picks.tolist()

    def _picked(
        self, picks: npt.NDArray[np.int64], upserts: Sequence[Capability]
    ) -> CapabilityTable:
        """The table whose row ``i`` is row ``picks[i]`` here, or ``upserts[-1 - picks[i]]``."""
        fresh = np.flatnonzero(picks < 0)
        news = {int(row): upserts[-1 - int(picks[row])] for row in fresh}
        records = {row: encode(capability) for row, capability in news.items()}
        lengths = np.diff(self.offsets)[np.maximum(picks, 0)]
        lengths[fresh] = [len(records[int(row)]) for row in fresh]
        offsets = np.zeros(len(picks) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        codes, values = self._picked_categories(picks, news)
        kept = np.maximum(picks, 0)  # a new row (-1) reads row 0, then takes its own flags
        available, open_rows = self.available[kept], self.open[kept]
        for row, capability in news.items():
            available[row], open_rows[row] = capability.available, capability.visibility.open
        ids = self.ids.picked(picks, {r: c.id for r, c in news.items()})
        hashes = self.rows.by_row()[kept] if len(self) else np.zeros(len(picks), np.uint64)
        for row, capability in news.items():
            hashes[row] = id_hash(capability.id)
        return CapabilityTable(
            ids,
            b"".join(self._runs(picks, records)),
            offsets,
            self.names.picked(picks, {r: c.name for r, c in news.items()}),
            codes,
            values,
            available,
            open_rows,
            IdRows.of(ids, hashes),
        )

    def _runs(
        self, picks: npt.NDArray[np.int64], records: dict[int, bytes]
    ) -> Iterator[bytes | memoryview]:
        """The records of ``picks``: runs of consecutive kept rows as one slice each."""
        for start, end in runs(picks):
            first, last = int(picks[start]), int(picks[end - 1])
            if first < 0:
                yield records[start]
            else:
                yield self._view[int(self.offsets[first]) : int(self.offsets[last + 1])]

    def _picked_categories(
        self, picks: npt.NDArray[np.int64], news: Mapping[int, Capability]
    ) -> tuple[npt.NDArray[np.int32], tuple[str, ...]]:
        """Category codes of ``picks`` and their values, numbered in order of first use (as a
        table made afresh numbers them)."""
        values = {value: code for code, value in enumerate(self.category_values)}
        codes = self.category_codes[np.maximum(picks, 0)].astype(np.int64)
        for row, capability in news.items():
            codes[row] = values.setdefault(capability.category, len(values))
        used, first = np.unique(codes, return_index=True)
        order = used[np.argsort(first, kind="stable")]
        renumber = np.zeros(len(values), dtype=np.int32)
        renumber[order] = np.arange(len(order), dtype=np.int32)
        named = list(values)
        return renumber[codes], tuple(named[code] for code in order.tolist())


def runs(picks: npt.NDArray[np.int64]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each run of ``picks``: consecutive entries that pick consecutive
    rows (``picks[i + 1] == picks[i] + 1``), or one entry that picks none (negative), in order.
    A delta's rows are a few such runs, each copied as one slice."""
    if not len(picks):
        return
    fresh = picks < 0
    breaks = np.flatnonzero(fresh[1:] | fresh[:-1] | (np.diff(picks) != 1)) + 1
    starts = [0, *breaks.tolist()]
    yield from zip(starts, [*breaks.tolist(), len(picks)], strict=True)


class PackedStrings(Sequence[str]):
    """Strings held as one UTF-8 byte array and their offsets, each decoded when read: a
    snapshot maps both from its files, so a worker keeps no Python string per row (at 100,000
    capabilities the retrieval index's row keys are 11 MB of file pages, read on use, against
    about 18 MB of strings built at every load). Equal to a tuple or list of the same strings."""

    __slots__ = ("_count", "blob", "offsets")

    def __init__(self, blob: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> None:
        if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[0]) != 0:
            raise ValueError("packed strings need offsets starting at 0")
        if int(offsets[-1]) != len(blob) or bool(np.any(np.diff(offsets) < 0)):
            raise ValueError(f"packed strings' offsets do not fit their {len(blob)} bytes")
        self.blob = blob
        self.offsets = offsets
        self._count = len(offsets) - 1

    @classmethod
    def of(cls, strings: Iterable[str]) -> PackedStrings:
        encoded = [text.encode() for text in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(
            np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:]
        )
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, row: int) -> str:  # type: ignore[override]
        if row < 0:
            row += self._count
        if not 0 <= row < self._count:
            raise IndexError(f"row {row} of {self._count} packed strings")
        return self.blob[self.offsets[row] : self.offsets[row + 1]].tobytes().decode()

    def __iter__(self) -> Iterator[str]:
        data, bounds = self.blob.tobytes(), self.offsets.tolist()
        return (data[start:end].decode() for start, end in pairwise(bounds))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedStrings):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(
                self.blob, other.blob
            )
        if isinstance(other, tuple | list):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def picked(self, picks: npt.NDArray[np.int64], news: Mapping[int, str]) -> PackedStrings:
        """The strings whose ``i``-th is ``self[picks[i]]``, or ``news[i]`` where ``picks[i]``
        is negative; runs of consecutive kept rows are copied as one slice each."""
        encoded = {row: text.encode() for row, text in news.items()}
        kept = np.maximum(picks, 0)
        lengths = self.offsets[kept + 1] - self.offsets[kept] if len(self) else kept * 0
        for row, data in encoded.items():
            lengths[row] = len(data)
        offsets = np.zeros(len(picks) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = np.empty(int(offsets[-1]), dtype=np.uint8)
        for start, end in runs(picks):
            first, last = int(picks[start]), int(picks[end - 1])
            to = slice(int(offsets[start]), int(offsets[end]))
            if first < 0:
                blob[to] = np.frombuffer(encoded[start], dtype=np.uint8)
            else:
                blob[to] = self.blob[int(self.offsets[first]) : int(self.offsets[last + 1])]
        return PackedStrings(blob, offsets)


class IdRows(Mapping[str, int]):
    """The row of each id, held as arrays: the ids' 64-bit hashes, sorted, and the row of
    each; a hash found is checked against the id at its row, so a collision never answers
    with the wrong row. Made once per table (a delta rehashes only its new ids), and mapped
    from a snapshot's files like the ids. A lookup takes about 3.6 µs against a dict's 0.07, so
    the ids found most recently (:data:`RECENT_IDS`: a turn reads its answers by id) are kept in
    a small dict."""

    def __init__(
        self, ids: PackedStrings, hashes: npt.NDArray[np.uint64], rows: npt.NDArray[np.int32]
    ) -> None:
        if len(hashes) != len(ids) or len(rows) != len(ids):
            raise ValueError(f"{len(hashes)} id hashes and {len(rows)} rows for {len(ids)} ids")
        if len(rows) and not 0 <= int(rows.min()) <= int(rows.max()) < len(ids):
            raise ValueError("the id rows do not fit the ids")
        self.ids = ids
        self.hashes = hashes
        self.rows = rows
        self._recent: dict[str, int] = {}

    @classmethod
    def of(cls, ids: PackedStrings, by_row: npt.NDArray[np.uint64] | None = None) -> IdRows:
        """The lookup of ``ids`` (``by_row``: their hashes in row order, when known)."""
        if by_row is None:
            by_row = np.fromiter(map(id_hash, ids), dtype=np.uint64, count=len(ids))
        order = np.argsort(by_row, kind="stable")
        made = cls(ids, by_row[order], order.astype(np.int32))
        same = np.flatnonzero(made.hashes[1:] == made.hashes[:-1])
        for at in same.tolist():
            if ids[int(made.rows[at])] == ids[int(made.rows[at + 1])]:
                raise ValueError(f"a capability table holds an id twice: {ids[int(made.rows[at])]}")
        return made

    def by_row(self) -> npt.NDArray[np.uint64]:
        """Each row's id hash, in row order."""
        hashes = np.empty(len(self.hashes), dtype=np.uint64)
        hashes[self.rows] = self.hashes
        return hashes

    def __len__(self) -> int:
        return len(self.hashes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __getitem__(self, cap_id: str) -> int:
        row = self._recent.get(cap_id)
        if row is not None:
            return row
        wanted = np.uint64(id_hash(cap_id))
        at = int(np.searchsorted(self.hashes, wanted))
        while at < len(self.hashes) and self.hashes[at] == wanted:
            row = int(self.rows[at])
            if self.ids[row] == cap_id:
                if len(self._recent) >= RECENT_IDS:
                    self._recent.clear()
                self._recent[cap_id] = row
                return row
            at += 1
        raise KeyError(cap_id)


def id_hash(text: str) -> int:
    """An id's stable 64-bit hash (the same in every process: the lookup is written to disk)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class RowView(Sequence[Capability]):
    """A :class:`CapabilityTable`'s capabilities by row (each parsed when read)."""

    def __init__(self, table: CapabilityTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, index: int) -> Capability: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Capability]: ...

    def __getitem__(self, index: int | slice) -> Capability | Sequence[Capability]:
        if isinstance(index, slice):
            return [self.table.row(i) for i in range(len(self.table))[index]]
        return self.table.row(index if index >= 0 else len(self.table) + index)


class _Columns:
    """The per-row columns of a table being made."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.names: list[str] = []
        self.categories: dict[str, int] = {}
        self.codes: list[int] = []
        self.available: list[bool] = []
        self.open: list[bool] = []

    @classmethod
    def of(cls, capabilities: Iterable[Capability]) -> _Columns:
        columns = cls()
        for capability in capabilities:
            columns.add(capability)
        return columns

    def add(self, capability: Capability) -> None:
        self.append(
            capability.id,
            capability.name,
            capability.category,
            capability.available,
            capability.visibility.open,
        )

    def append(self, cap_id: str, name: str, category: str, available: bool, is_open: bool) -> None:
        self.ids.append(cap_id)
        self.names.append(name)
        self.codes.append(self.categories.setdefault(category, len(self.categories)))
        self.available.append(available)
        self.open.append(is_open)

    def table(self, records: Sequence[bytes | memoryview]) -> CapabilityTable:
        """The table of ``records`` with these columns."""
        lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return CapabilityTable(
            PackedStrings.of(self.ids),
            b"".join(records),
            offsets,
            PackedStrings.of(self.names),
            np.asarray(self.codes, dtype=np.int32),
            tuple(self.categories),
            np.asarray(self.available, dtype=bool),
            np.asarray(self.open, dtype=bool),
        )


def dense_strings(strings: Iterable[str]) -> list[str]:
    """Copies of ``strings`` made at once (one join, one split), so they lie side by side.

    Strings kept for a snapshot's life (ids, names, terms) but made one by one while records
    are parsed lie among the parsed objects, and each keeps the allocator's arena it is in
    from being returned once those are freed: measured, 50,000 capabilities' ids and names
    held that way kept 40 MB more resident than the same strings copied like this. ``strings``
    as they are when one holds the separator."""
    items = list(strings)
    if not items:
        return items
    parts = "\x00".join(items).split("\x00")
    return parts if len(parts) == len(items) else items


def table_arrays(table: CapabilityTable) -> dict[str, Any]:
    """The table as arrays and a JSON-able part, for a file (:func:`table_from_arrays`)."""
    return {
        "blob": np.frombuffer(table.blob, dtype=np.uint8)
        if isinstance(table.blob, bytes)
        else table.blob,
        "offsets": table.offsets,
        "category_codes": table.category_codes,
        "available": table.available,
        "open": table.open,
        "ids.blob": table.ids.blob,
        "ids.offsets": table.ids.offsets,
        "names.blob": table.names.blob,
        "names.offsets": table.names.offsets,
        "id_hashes": table.rows.hashes,
        "id_rows": table.rows.rows,
        "json": {"format": FORMAT, "categories": list(table.category_values)},
    }


def table_from_arrays(arrays: Mapping[str, Any]) -> CapabilityTable:
    """The table :func:`table_arrays` gave (its blob may be memory-mapped)."""
    meta = arrays["json"]
    if meta.get("format") != FORMAT:
        raise ValueError(f"records in format {meta.get('format')!r}; this code reads {FORMAT!r}")
    ids = PackedStrings(arrays["ids.blob"], np.asarray(arrays["ids.offsets"], dtype=np.int64))
    return CapabilityTable(
        ids,
        arrays["blob"],
        np.asarray(arrays["offsets"], dtype=np.int64),
        PackedStrings(arrays["names.blob"], np.asarray(arrays["names.offsets"], dtype=np.int64)),
        np.asarray(arrays["category_codes"], dtype=np.int32),
        tuple(meta["categories"]),
        np.asarray(arrays["available"], dtype=bool),
        np.asarray(arrays["open"], dtype=bool),
        IdRows(ids, arrays["id_hashes"], arrays["id_rows"]),
    )
