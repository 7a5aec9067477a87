"""Capability names and the exact-name path: the table of names that identify one capability,
and the capabilities a query names.

A query names a capability by its id, its name as written, or its display name. Names that are
ordinary words of the catalog ("search", "local") are left out of the table, so prose does not
trigger an exact match.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from capdisc.captable import dense_strings
from capdisc.models import Capability
from capdisc.retrieval.lexical import STOPWORDS, LexicalIndex

#: A name as a query can write it: one lowercased token, or several words as capitalized.
NameKey = tuple[str, ...]
#: Between the words of a several-word key, and between the keys of one row, in their text.
WORDS = "\x1e"
KEYS = "\x1f"

_RAW_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/&-]*[A-Za-z0-9]|[A-Za-z0-9]")
_WORD = re.compile(r"[^\W_]+")
_MAX_NAME_WORDS = 6
#: Queries whose name keys a table remembers (all forgotten at once when full).
QUERIES_REMEMBERED = 4096


@dataclass(frozen=True, eq=False)
class NameTable:
    """Name key -> row, held as arrays: each key's 64-bit hash (sorted) and its row, plus the
    first words of the several-word names (a query's word runs are looked up only there). A
    hash found is checked against the row's own keys (``row_keys``), so a collision never
    names the wrong capability."""

    hashes: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.int32]
    starts: frozenset[str]
    _queries: dict[str, tuple[tuple[str, ...], npt.NDArray[np.uint64]]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __len__(self) -> int:
        return len(self.hashes)

    def query_keys(self, query: str) -> tuple[tuple[str, ...], npt.NDArray[np.uint64]]:
        """The key texts ``query`` could name a capability by (:func:`_query_keys`) and their
        hashes, remembered as a query's parts are (up to :data:`QUERIES_REMEMBERED` queries,
        then forgotten at once): a repeated turn hashes nothing."""
        found = self._queries.get(query)
        if found is None:
            texts = tuple(key_text(key) for key in _query_keys(query, self.starts))
            found = (texts, _hashes(texts))
            if len(self._queries) >= QUERIES_REMEMBERED:
                self._queries.clear()
            self._queries[query] = found
        return found

    def lookup(
        self, texts: Sequence[str], wanted: npt.NDArray[np.uint64], row_keys: Sequence[str]
    ) -> Iterator[int]:
        """The row each of ``texts`` (key texts, :func:`key_text`, whose :func:`key_hash` are
        ``wanted``) names, in order."""
        if not texts or not len(self.hashes):
            return
        at = np.minimum(np.searchsorted(self.hashes, wanted), len(self.hashes) - 1)
        for i in np.flatnonzero(self.hashes[at] == wanted).tolist():
            row = int(self.rows[at[i]])
            if texts[i] in row_keys[row].split(KEYS):
                yield row


def key_text(key: NameKey) -> str:
    """A key as one string (its words joined by :data:`WORDS`)."""
    return WORDS.join(key)


def key_hash(text: str) -> int:
    """A key text's stable 64-bit hash (the same in every process: a table is written to disk)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def row_name_keys(capability: Capability) -> str:
    """The distinct keys that could name ``capability`` in the table (:func:`_distinctive`
    ones), as one string (key texts joined by :data:`KEYS`): a large catalog keeps one of these
    per capability."""
    return KEYS.join(key_text(key) for key in _name_keys(capability) if _distinctive(key))


def build_name_table(row_keys: Sequence[str], lexicon: LexicalIndex) -> NameTable:
    """Name key -> row, keeping only keys that identify one capability and are not ordinary
    words of the catalog (a one-word key must appear in at most one capability's text)."""
    owner: dict[str, int] = {}
    shared: set[str] = set()
    for row, packed in enumerate(row_keys):
        for key in packed.split(KEYS) if packed else ():
            if owner.setdefault(key, row) != row:
                shared.add(key)
    plain = [key for key in owner if key.isalpha() and key not in shared]
    frequencies = lexicon.document_frequencies(plain)
    kept = [
        (key, row)
        for key, row in owner.items()
        if key not in shared and (WORDS in key or frequencies.get(key, 0) <= 1)
    ]
    return name_table(
        [key_hash(key) for key, _ in kept],
        [row for _, row in kept],
        (key.split(WORDS, 1)[0] for key, _ in kept if WORDS in key),
    )


def name_table(hashes: Sequence[int], rows: Sequence[int], starts: Iterable[str]) -> NameTable:
    """A :class:`NameTable` of these keys' hashes and rows (in any order)."""
    keyed = np.asarray(hashes, dtype=np.uint64)
    order = np.argsort(keyed, kind="stable")
    return NameTable(
        keyed[order], np.asarray(rows, dtype=np.int32)[order], frozenset(dense_strings(starts))
    )


def named_rows(query: str, names: NameTable, row_keys: Sequence[str]) -> Iterator[int]:
    """Rows of the capabilities ``query`` names, its raw tokens first, then its runs of words
    (longest first); the first one a search allows is its exact match."""
    texts, hashes = names.query_keys(query)
    return names.lookup(texts, hashes, row_keys)


def _hashes(texts: Sequence[str]) -> npt.NDArray[np.uint64]:
    hashes = np.fromiter((key_hash(t) for t in texts), dtype=np.uint64, count=len(texts))
    hashes.flags.writeable = False  # shared by every turn that asks the same query
    return hashes


def _name_keys(capability: Capability) -> dict[NameKey, None]:
    """The keys a query can name ``capability`` by (distinct, in order): its id and name as
    written (one token, any case) and its display name (one token any case, or several words
    as capitalized)."""
    keys: dict[NameKey, None] = {(capability.id.lower(),): None, (capability.name.lower(),): None}
    display = _WORD.findall(capability.display_name)
    if len(display) == 1:
        keys[(display[0].lower(),)] = None
    elif 1 < len(display) <= _MAX_NAME_WORDS:
        keys[tuple(display)] = None
    return keys


def _distinctive(key: NameKey) -> bool:
    """Whether ``key`` can name a capability at all: several words, or one word of three
    characters or more that is not a stop word (an ordinary word must also be rare)."""
    if len(key) > 1:
        return True
    word = key[0]
    return len(word) >= 3 and word not in STOPWORDS and any(c.isalpha() for c in word)


def _query_keys(query: str, starts: Collection[str]) -> Iterable[NameKey]:
    """Candidate name keys of a query: its raw tokens, then the runs of words that begin like a
    several-word name (longest first)."""
    for raw in _RAW_TOKEN.findall(query):
        yield (raw.lower(),)
    tokens = _WORD.findall(query)
    for start, token in enumerate(tokens):
        if token in starts:
            for n in range(min(_MAX_NAME_WORDS, len(tokens) - start), 1, -1):
                yield tuple(tokens[start : start + n])
