"""The exact-name table held as key hashes: what it finds, and that a hash is never trusted
alone."""

from __future__ import annotations

import pytest

from capdisc.models import Capability
from capdisc.retrieval import names as names_module
from capdisc.retrieval.lexical import LexicalIndex
from capdisc.retrieval.names import (
    NameTable,
    build_name_table,
    key_hash,
    key_text,
    name_table,
    named_rows,
    row_name_keys,
)


def cap(cap_id: str, name: str, display: str, description: str) -> Capability:
    return Capability(
        id=cap_id, kind="tool", name=name, display_name=display, description=description
    )


CAPS = [
    cap("tool:gh-create-issue", "gh_create_issue", "Create Issue", "Open an issue in a repo."),
    cap("tool:weather", "weather", "Weather", "Current weather for a city."),
    cap("tool:forecast", "forecast", "Forecast", "The weather of the coming days."),
]


def table() -> tuple[list[str], NameTable]:
    keys = [row_name_keys(c) for c in CAPS]
    lexicon = LexicalIndex.build([f"{c.name} {c.description}" for c in CAPS])
    return keys, build_name_table(keys, lexicon)


def test_a_query_names_a_capability_by_its_id_name_or_display_words() -> None:
    keys, names = table()

    assert list(named_rows("run gh_create_issue now", names, keys)) == [0]
    assert list(named_rows("use Create Issue please", names, keys)) == [0]
    assert list(named_rows("call tool:forecast", names, keys)) == [2]


def test_an_ordinary_word_of_the_catalog_names_nothing() -> None:
    keys, names = table()

    assert list(named_rows("what is the weather", names, keys)) == []


def test_a_hash_that_matches_another_key_names_nothing() -> None:
    keys = [row_name_keys(c) for c in CAPS]
    colliding = name_table([key_hash(key_text(("tool:intruder",)))], [1], ())

    assert list(named_rows("call tool:intruder", colliding, keys)) == []


def test_a_repeated_query_names_what_it_named_the_first_time() -> None:
    keys, names = table()

    first = list(named_rows("use Create Issue and call tool:forecast", names, keys))
    again = list(named_rows("use Create Issue and call tool:forecast", names, keys))

    assert first == again == [2, 0]


def test_a_table_forgets_its_queries_when_it_has_remembered_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys, names = table()
    monkeypatch.setattr(names_module, "QUERIES_REMEMBERED", 2)

    for query in ("call tool:weather", "call tool:forecast", "run gh_create_issue"):
        names.query_keys(query)

    assert list(names._queries) == ["run gh_create_issue"]
    assert list(named_rows("call tool:weather", names, keys)) == [1]
