"""Capability names and the exact-name path: the table of names that identify one capability,
and the capabilities a query names.

A query names a capability by its id, its name as written, or its display name. Names that are
ordinary words of the catalog ("search", "local") are left out of the table, so prose does not
trigger an exact match.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from capdisc.models import Capability
from capdisc.retrieval.lexical import STOPWORDS, LexicalIndex

#: A name as a query can write it: one lowercased token, or several words as capitalized.
NameKey = tuple[str, ...]

_RAW_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/&-]*[A-Za-z0-9]|[A-Za-z0-9]")
_WORD = re.compile(r"[^\W_]+")
_MAX_NAME_WORDS = 6


def row_name_keys(capability: Capability) -> tuple[NameKey, ...]:
    """The distinct keys that could name ``capability`` in the table (:func:`_distinctive`
    ones). A tuple, and an id or name already in lower case is not copied: a large catalog
    keeps one of these per capability."""
    return tuple(key for key in _name_keys(capability) if _distinctive(key))


def build_name_table(
    row_keys: Sequence[Collection[NameKey]], lexicon: LexicalIndex
) -> dict[NameKey, int]:
    """Name key -> row, keeping only keys that identify one capability and are not ordinary
    words of the catalog (a one-word key must appear in at most one capability's text)."""
    owner: dict[NameKey, int] = {}
    shared: set[NameKey] = set()
    for row, keys in enumerate(row_keys):
        for key in keys:
            if owner.setdefault(key, row) != row:
                shared.add(key)
    plain = [key[0] for key in owner if len(key) == 1 and key[0].isalpha() and key not in shared]
    frequencies = lexicon.document_frequencies(plain)
    return {
        key: row
        for key, row in owner.items()
        if key not in shared and (len(key) > 1 or frequencies.get(key[0], 0) <= 1)
    }


def name_starts(names: Iterable[NameKey]) -> frozenset[str]:
    """First words of the several-word names, so a query's word runs are looked up only there."""
    return frozenset(key[0] for key in names if len(key) > 1)


def named_rows(query: str, names: Mapping[NameKey, int], starts: Collection[str]) -> Iterator[int]:
    """Rows of the capabilities ``query`` names, its raw tokens first, then its runs of words
    (longest first); the first one a search allows is its exact match."""
    for key in _query_keys(query, starts):
        row = names.get(key)
        if row is not None:
            yield row


def _name_keys(capability: Capability) -> dict[NameKey, None]:
    """The keys a query can name ``capability`` by (distinct, in order): its id and name as
    written (one token, any case) and its display name (one token any case, or several words
    as capitalized)."""
    keys: dict[NameKey, None] = {(_lower(capability.id),): None, (_lower(capability.name),): None}
    display = _WORD.findall(capability.display_name)
    if len(display) == 1:
        keys[(_lower(display[0]),)] = None
    elif 1 < len(display) <= _MAX_NAME_WORDS:
        keys[tuple(display)] = None
    return keys


def _lower(text: str) -> str:
    """``text`` in lower case; ``text`` itself when it already is (no copy held)."""
    low = text.lower()
    return text if low == text else low


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
