"""BM25 over capability text: the tokenizer for tool text and the lexical index."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc.identifiers import split_identifiers
from capdisc.retrieval import lexical
from capdisc.retrieval.lexical import (
    LexicalIndex,
    index_terms,
    stemming_available,
    tokenize,
    words,
)

DOCS = [
    "getWeatherForecast: returns the weather forecast for a city",
    "convert_currency: converts money between currencies",
    "send-email: sends an email message",
    "weather radar map tiles",
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("getWeatherForecast", ["get", "weather", "forecast"]),
        ("list_pull-requests", ["list", "pull", "requests"]),
        ("HTTPServer", ["http", "server"]),
        ("s3-upload mp3", ["s", "3", "upload", "mp", "3"]),
        ("Café résumé", ["café", "résumé"]),
        ("", []),
    ],
)
def test_words_split_identifiers_and_lowercase(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("please tell me the weather", ["tell", "weather"]),
        ("Can you turn off the lights?", ["turn", "off", "lights"]),
        ("the and of", []),
    ],
)
def test_tokenize_drops_stop_words_keeps_direction_words(text: str, expected: list[str]) -> None:
    assert tokenize(text, stem=False) == expected


@pytest.mark.skipif(not stemming_available(), reason="PyStemmer is not installed")
@pytest.mark.parametrize(("a", "b"), [("searches", "searching"), ("forecasts", "forecast")])
def test_stemming_conflates_inflections(a: str, b: str) -> None:
    assert tokenize(a) == tokenize(b)


def test_index_terms_add_adjacent_pairs() -> None:
    assert index_terms("thyroid function level", stem=False) == [
        "thyroid",
        "function",
        "level",
        "thyroid_function",
        "function_level",
    ]


def test_split_identifiers_keeps_words_apart() -> None:
    assert split_identifiers("getWeather now") == "get Weather now"


@pytest.fixture(scope="module")
def lexicon() -> LexicalIndex:
    return LexicalIndex.build(DOCS)


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("weather forecast", 0),
        ("currency conversion", 1),
        ("email", 2),
        ("radar", 3),
    ],
)
def test_best_document_per_query(lexicon: LexicalIndex, query: str, best: int) -> None:
    assert int(np.argmax(lexicon.search(query))) == best


def test_unknown_words_score_nothing(lexicon: LexicalIndex) -> None:
    assert not lexicon.search("zebra xylophone").any()


def test_phrase_outscores_scattered_words() -> None:
    index = LexicalIndex.build(["thyroid function test", "function of the thyroid gland test"])
    scores = index.search("thyroid function")
    assert scores[0] > scores[1]


def test_scores_many_equals_one_by_one(lexicon: LexicalIndex) -> None:
    queries = ["weather", "send email message", "nothing here"]
    ids = [lexicon.term_ids(q) for q in queries]
    together = lexicon.scores_many(ids)
    for row, term_ids in zip(together, ids, strict=True):
        np.testing.assert_allclose(row, lexicon.scores(term_ids))


@pytest.mark.parametrize(
    ("query", "rows", "expected"),
    [
        ("weather forecast", [0, 3, 2], [1.0, None, 0.0]),
        ("zebra", [0], [0.0]),
    ],
)
def test_coverage_is_the_matched_share_of_query_weight(
    lexicon: LexicalIndex, query: str, rows: list[int], expected: list[float | None]
) -> None:
    coverage = lexicon.coverage(lexicon.term_ids(query), rows)
    for value, want in zip(coverage, expected, strict=True):
        if want is None:
            assert 0.0 < value < 1.0
        else:
            assert value == pytest.approx(want)


@pytest.mark.parametrize(
    ("word", "count"), [("weather", 2), ("email", 1), ("the", 0), ("zebra", 0)]
)
def test_document_frequency(lexicon: LexicalIndex, word: str, count: int) -> None:
    assert lexicon.document_frequency(word) == count


def test_empty_catalog_scores_nothing() -> None:
    index = LexicalIndex.build([])
    assert index.search("weather").shape == (0,)


# -- the BM25 builder: bm25s's numbers, and updates that re-tokenize only what changed ---------

CORPUS = [
    *DOCS,
    "",
    "weather weather weather alerts",
    "send a message to a slack channel; post messages, channels and threads",
    "currency exchange rates for a currency pair",
]


def _score_table(index: LexicalIndex) -> dict[tuple[str, int], float]:
    terms = {term_id: term for term, term_id in index.vocabulary.items()}
    table = {}
    data, indices, indptr = index.postings()
    for term_id, term in terms.items():
        for at in range(int(indptr[term_id]), int(indptr[term_id + 1])):
            table[(term, int(indices[at]))] = float(data[at])
    return table


def _bm25s_table(documents: list[str]) -> dict[tuple[str, int], float]:
    import bm25s

    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index([index_terms(d) or [""] for d in documents], show_progress=False)
    scores, vocab = retriever.scores, retriever.vocab_dict
    terms = {int(v): str(k) for k, v in vocab.items()}
    table = {}
    for term_id, term in terms.items():
        for at in range(int(scores["indptr"][term_id]), int(scores["indptr"][term_id + 1])):
            table[(term, int(scores["indices"][at]))] = float(scores["data"][at])
    return table


def test_bm25_scores_equal_bm25s() -> None:
    ours, theirs = _score_table(LexicalIndex.build(CORPUS)), _bm25s_table(CORPUS)

    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-5), key


def test_an_update_scores_like_a_fresh_build() -> None:
    before = LexicalIndex.build(CORPUS)
    changed = [CORPUS[2], "weather radar for storms", CORPUS[5], "a brand new zebra tool"]
    reuse = [2, None, 5, None]

    updated = LexicalIndex.build(changed, previous=before, reuse=reuse)
    fresh = LexicalIndex.build(changed)

    for query in ["weather radar", "send email", "zebra", "storms alerts"]:
        np.testing.assert_allclose(updated.search(query), fresh.search(query), rtol=1e-5)
    np.testing.assert_allclose(
        updated.coverage(updated.term_ids("weather storms"), [1, 2]),
        fresh.coverage(fresh.term_ids("weather storms"), [1, 2]),
    )


POOL = ["weather", "radar", "email", "send", "zebra", "invoice", "pay", "storm", "map", "tile"]
texts = st.lists(st.sampled_from(POOL), min_size=0, max_size=12).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(texts, min_size=1, max_size=12),
    st.lists(st.tuples(st.booleans(), st.booleans(), texts), max_size=12),
    st.lists(texts, max_size=4),
)
def test_an_in_order_update_is_the_index_a_full_update_makes(
    old: list[str], fate: list[tuple[bool, bool, str]], added: list[str]
) -> None:
    before = LexicalIndex.build(old)
    documents: list[str] = []
    reuse: list[int | None] = []
    for row in range(len(old)):
        kept, changed, new_text = fate[row] if row < len(fate) else (True, False, "")
        if kept:
            documents.append(new_text if changed else "")
            reuse.append(None if changed else row)
    documents += added
    reuse += [None] * len(added)

    taken: list[bool] = []
    update = lexical._updated

    def spied(*args: Any) -> LexicalIndex | None:
        result = update(*args)
        taken.append(result is not None)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "_updated", spied)
        patch.setattr(lexical, "CHUNK", 5)  # arithmetic a few postings at a time
        updated = LexicalIndex.build(documents, previous=before, reuse=reuse)
        patch.setattr(lexical, "_updated", lambda *_args: None)  # the full path: sort again
        full = LexicalIndex.build(documents, previous=before, reuse=reuse)

    assert taken == [True]
    assert updated.vocabulary == full.vocabulary and updated.num_docs == full.num_docs
    for name in (
        "data",
        "indices",
        "indptr",
        "idf",
        "doc_indptr",
        "doc_terms",
        "doc_tf",
        "doc_len",
        "dense_terms",
        "dense_rows",
        "dense_df",
    ):
        assert np.array_equal(getattr(updated, name), getattr(full, name)), name
        assert getattr(updated, name).dtype == getattr(full, name).dtype, name


def test_an_update_reuses_terms_instead_of_the_text() -> None:
    before = LexicalIndex.build(CORPUS)

    updated = LexicalIndex.build(["text that is not read"], previous=before, reuse=[0])

    assert int(np.argmax(updated.search("weather forecast"))) == 0
    assert not updated.search("text read").any()


def test_postings_hold_32_bit_ids() -> None:
    index = LexicalIndex.build(DOCS)

    assert index.indices.dtype == np.int32
    assert index.doc_terms.dtype == np.int32


def _without_dense_rows(index: LexicalIndex) -> LexicalIndex:
    data, indices, indptr = index.postings()
    return replace(
        index,
        data=data,
        indices=indices,
        indptr=indptr,
        dense_terms=np.zeros(0, dtype=np.int32),
        dense_rows=np.zeros((0, index.num_docs), dtype=np.float32),
        dense_df=np.zeros(0, dtype=np.int64),
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(texts, min_size=1, max_size=20),
    st.lists(texts, min_size=1, max_size=4),
    st.sampled_from([0.0, 0.1, 0.5]),
    st.sampled_from([1, 3, 32]),
)
def test_dense_rows_score_as_the_postings_do(
    documents: list[str], queries: list[str], share: float, most: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "DENSE_SHARE", share)
        patch.setattr(lexical, "DENSE_TERMS", most)
        index = LexicalIndex.build(documents)
    postings_only = _without_dense_rows(index)
    ids = [index.term_ids(q) for q in queries]

    np.testing.assert_allclose(index.scores_many(ids), postings_only.scores_many(ids), atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(texts, min_size=1, max_size=20),
    st.lists(texts, min_size=1, max_size=4),
    st.sampled_from([0.0, 0.3]),
)
def test_score_sums_are_the_sums_of_the_scores(
    documents: list[str], queries: list[str], share: float
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "DENSE_SHARE", share)
        index = LexicalIndex.build(documents)
    ids = [index.term_ids(q) for q in queries]
    expected = index.scores_many(ids).sum(axis=1, dtype=np.float64)

    np.testing.assert_allclose(index.score_sums(ids), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(index.score_sums(ids), expected, rtol=1e-6, atol=1e-6)  # kept


@pytest.mark.parametrize(
    ("df", "share", "most", "expected"),
    [
        ([6, 1, 9, 2], 0.5, 32, [0, 2]),  # in more than half of 10 documents
        ([6, 1, 9, 2], 0.5, 1, [2]),  # only the most frequent one
        ([6, 9, 7, 8], 0.1, 2, [1, 3]),  # the two most frequent, by id
        ([1, 1, 1, 1], 0.1, 32, []),  # none in more than one document of 10
    ],
)
def test_frequent_terms_get_dense_rows(
    df: list[int], share: float, most: int, expected: list[int]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "DENSE_SHARE", share)
        patch.setattr(lexical, "DENSE_TERMS", most)
        chosen = lexical._frequent_terms(np.asarray(df, dtype=np.int64), 10)

    assert chosen.tolist() == expected and chosen.dtype == np.int32


def test_a_frequent_term_is_scored_from_its_dense_row() -> None:
    index = LexicalIndex.build(["weather map", "weather radar", "weather alerts", "email"])
    weather = index.vocabulary["weather"]
    assert weather in index.dense_terms.tolist()
    blanked = replace(index, data=np.zeros_like(index.data))  # the other terms' postings

    scores = blanked.scores(np.asarray([weather], dtype=np.int64))

    assert (scores[:3] > 0).all() and scores[3] == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(texts, min_size=1, max_size=20), st.sampled_from([0.0, 0.3]))
def test_postings_give_back_every_terms_postings(documents: list[str], share: float) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "DENSE_TERMS", 0)
        whole = LexicalIndex.build(documents)
        patch.setattr(lexical, "DENSE_SHARE", share)
        patch.setattr(lexical, "DENSE_TERMS", 3)
        index = LexicalIndex.build(documents)

    for got, want in zip(index.postings(), whole.postings(), strict=True):
        assert np.array_equal(got, want) and got.dtype == want.dtype
    kept = int(np.diff(whole.indptr)[index.dense_terms].sum())
    assert index.data.size == whole.data.size - kept  # a dense row's postings are not kept


def test_a_dense_terms_document_frequency_is_kept() -> None:
    index = LexicalIndex.build(["weather map", "weather radar", "weather alerts", "email"])
    assert index.vocabulary["weather"] in index.dense_terms.tolist()

    assert index.document_frequency("weather") == 3
    assert index.document_frequencies(["weather", "email"]) == {"weather": 3, "email": 1}


def test_long_postings_copied_score_as_gathered_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = {0: "weather report city", 1: "stock quote", 2: "city stock"}
    docs = [kinds.get(i % 20, f"filler text {i}") for i in range(600)]  # query terms in 5-10%
    index = LexicalIndex.build(docs)
    queries = [index.term_ids("weather city"), index.term_ids("stock quote 7")]
    gathered = index.scores_many(queries)

    monkeypatch.setattr(lexical, "COPY_RUNS_FROM", 1)
    copied = index.scores_many(queries)

    np.testing.assert_array_equal(copied, gathered)


def test_a_query_is_tokenized_as_a_document_is() -> None:
    text = "Upload the HTTPServer logs and email them"

    assert list(lexical.query_terms(text, True)) == lexical.index_terms(text, stem=True)
    assert lexical.query_terms(text, True) is lexical.query_terms(text, True)
