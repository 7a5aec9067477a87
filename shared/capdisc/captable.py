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

import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from capdisc.access import Caller, visible
from capdisc.models import Capability

#: Parsed capabilities kept per table (least recently read dropped first).
PARSED_CACHE = 1024
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
        ids: tuple[str, ...],
        blob: bytes | Bytes,
        offsets: Offsets,
        names: tuple[str, ...],
        category_codes: npt.NDArray[np.int32],
        category_values: tuple[str, ...],
        available: BoolArray,
        open_rows: BoolArray,
    ) -> None:
        if not len(ids) + 1 == len(offsets) == len(names) + 1 == len(category_codes) + 1:
            raise ValueError(
                f"a capability table of {len(ids)} ids has {len(offsets) - 1} records, "
                f"{len(names)} names and {len(category_codes)} categories"
            )
        self.ids = ids
        self.rows = {cap_id: row for row, cap_id in enumerate(ids)}
        if len(self.rows) != len(ids):
            raise ValueError("a capability table holds an id twice")
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
        return _Columns.of(caps).table([encode(c) for c in caps], dense=True)

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
        return CapabilityTable(
            tuple(_picked_strings(self.ids, picks, {r: c.id for r, c in news.items()})),
            b"".join(self._runs(picks, records)),
            offsets,
            tuple(_picked_strings(self.names, picks, {r: c.name for r, c in news.items()})),
            codes,
            values,
            available,
            open_rows,
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


def _picked_strings(
    strings: Sequence[str], picks: npt.NDArray[np.int64], news: Mapping[int, str]
) -> list[str]:
    """``strings[picks[i]]`` for each kept row, ``news[i]`` for each fresh one."""
    picked = [strings[p] for p in np.maximum(picks, 0).tolist()]
    for row, value in news.items():
        picked[row] = value
    return picked


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

    def table(self, records: Sequence[bytes | memoryview], *, dense: bool) -> CapabilityTable:
        """The table of ``records`` with these columns; ``dense``: copy the ids and names side
        by side (:func:`dense_strings`: a table made of freshly parsed capabilities; a changed
        table reuses its predecessor's, already side by side)."""
        copied = dense_strings if dense else list
        lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return CapabilityTable(
            tuple(copied(self.ids)),
            b"".join(records),
            offsets,
            tuple(copied(self.names)),
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
        "json": {
            "format": FORMAT,
            "ids": list(table.ids),
            "names": list(table.names),
            "categories": list(table.category_values),
        },
    }


def table_from_arrays(arrays: Mapping[str, Any]) -> CapabilityTable:
    """The table :func:`table_arrays` gave (its blob may be memory-mapped)."""
    meta = arrays["json"]
    if meta.get("format") != FORMAT:
        raise ValueError(f"records in format {meta.get('format')!r}; this code reads {FORMAT!r}")
    return CapabilityTable(
        tuple(meta["ids"]),
        arrays["blob"],
        np.asarray(arrays["offsets"], dtype=np.int64),
        tuple(meta["names"]),
        np.asarray(arrays["category_codes"], dtype=np.int32),
        tuple(meta["categories"]),
        np.asarray(arrays["available"], dtype=bool),
        np.asarray(arrays["open"], dtype=bool),
    )
