"""A query text's BM25 figures over a large catalog, remembered: the scores of given rows, the
catalog moments and the best allowed rows each equal what a full score row gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc.retrieval import lexical
from capdisc.retrieval.lexical import LexicalIndex
from capdisc.retrieval.scoring import LexicalScores
from capdisc.retrieval.textstats import TextMemo, TextStats, scores_at
from capdisc.retrieval.topk import best_matching

WORDS = ["weather", "forecast", "email", "send", "city", "radar", "map", "money", "list", "get"]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)


def _catalog(rows: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 8)))) for _ in range(rows)]


def _lexicon(documents: list[str], share: float) -> LexicalIndex:
    """BM25 over ``documents``, terms in more than ``share`` of them held as dense rows."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical, "DENSE_SHARE", share)
        return LexicalIndex.build(documents)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(texts, min_size=1, max_size=30),
    st.lists(texts, min_size=1, max_size=4),
    st.sampled_from([0.1, 0.5, 1.0]),
    st.data(),
)
def test_scores_at_rows_are_the_full_rows_there(
    documents: list[str], queries: list[str], share: float, data: st.DataObject
) -> None:
    index = _lexicon(documents, share)
    ids = [index.term_ids(q) for q in queries]
    picked = data.draw(st.lists(st.integers(0, len(documents) - 1), unique=True))
    rows = np.asarray(sorted(picked), dtype=np.int64)

    got = scores_at(index, ids, rows)

    np.testing.assert_allclose(got, index.scores_many(ids)[:, rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("share", [0.1, 1.0])
def test_remembered_moments_equal_the_full_rows(share: float) -> None:
    index = _lexicon(_catalog(3000, 1), share)
    ids = [index.term_ids(q) for q in ["get weather forecast", "send email", "map money"]]
    everyone = np.ones(index.num_docs, dtype=bool)

    full = LexicalScores.full(index, ids, everyone)
    remembered = LexicalScores.remembered(TextMemo(), index, ids, everyone, 64)

    for got, want in zip(remembered.moments, full.moments, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(
    ("admitted_share", "k"),
    [(1.0, 10), (0.5, 64), (0.05, 64), (0.0, 10)],  # the last two: the kept rows cannot tell
)
def test_the_best_allowed_rows_are_those_of_the_full_row(admitted_share: float, k: int) -> None:
    index = _lexicon(_catalog(3000, 2), 0.1)
    ids = [index.term_ids("weather radar map")]
    allowed = np.random.default_rng(3).random(index.num_docs) < admitted_share
    row = index.scores(ids[0])

    best = LexicalScores.remembered(TextMemo(), index, ids, allowed, k).matching(0, k)

    want = best_matching(row, allowed, k)
    assert allowed[best].all() and len(set(best.tolist())) == best.size
    assert sorted(row[best].tolist()) == sorted(row[want].tolist())
    assert (np.diff(row[best]) <= 0).all()  # best first


def test_kept_rows_cannot_tell_when_too_few_are_allowed() -> None:
    row = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.5], dtype=np.float32)
    stats = TextStats.of(row, float(row.sum()), kept=3)
    allowed = np.array([False, False, True, True, True, True])

    assert stats.matching(np.ones(6, dtype=bool), 2).tolist() == [0, 1]
    assert stats.matching(allowed, 1).tolist() == [2]
    assert stats.matching(allowed, 2) is None  # rows 3 and 4 were not kept


def test_every_matching_row_kept_tells_however_few_are_allowed() -> None:
    row = np.array([5.0, 0.0, 3.0, 0.0], dtype=np.float32)
    stats = TextStats.of(row, float(row.sum()), kept=3)

    assert stats.complete
    assert stats.matching(np.array([False, True, True, True]), 3).tolist() == [2]


def test_a_text_is_scored_once_and_then_remembered() -> None:
    index = _lexicon(_catalog(500, 4), 0.1)
    memo = TextMemo()
    ids = index.term_ids("send email")

    first = memo.stats(index, ids, 16)

    assert memo.stats(index, ids, 16) is first
    assert memo.stats(index, ids, 8) is first  # fewer rows asked: what is kept serves


def test_a_forgotten_text_is_scored_again() -> None:
    index = _lexicon(_catalog(500, 5), 0.1)
    memo = TextMemo()
    ids = index.term_ids("weather map")
    first = memo.stats(index, ids, 16)

    memo.forget()

    assert len(memo) == 0
    again = memo.stats(index, ids, 16)
    assert again is not first and again.best.tolist() == first.best.tolist()


def test_a_memo_lists_its_texts_latest_last_with_the_rows_each_kept() -> None:
    index = _lexicon(_catalog(500, 6), 0.1)
    memo = TextMemo()
    for query, kept in [("send email", 16), ("weather map", 32), ("get money", 8)]:
        memo.stats(index, index.term_ids(query), kept)

    recent = memo.recent(2)

    assert [(ids.tolist(), kept) for ids, kept in recent] == [
        (index.term_ids("weather map").tolist(), 32),
        (index.term_ids("get money").tolist(), 8),
    ]


def test_a_memo_warmed_from_another_holds_what_its_own_searches_would_compute() -> None:
    old, new = _lexicon(_catalog(500, 7), 0.1), _lexicon(_catalog(520, 8), 0.1)
    previous = TextMemo()
    for query in ["send email", "weather radar map"]:
        previous.stats(old, old.term_ids(query), 16)
    warmed = TextMemo()

    texts = [(new.ids_of(old.terms_of(ids)), kept) for ids, kept in previous.recent(10)]
    made = warmed.warm(new, texts)

    assert made == 2 and len(warmed) == 2
    for query in ["send email", "weather radar map"]:
        ids = new.term_ids(query)
        got, want = warmed.stats(new, ids, 16), TextMemo().stats(new, ids, 16)
        assert got.best.tolist() == want.best.tolist()
        assert got.total == pytest.approx(want.total) and got.kept == want.kept


def test_a_warm_stops_when_told_to() -> None:
    index = _lexicon(_catalog(500, 9), 0.1)
    previous = TextMemo()
    for query in ["send email", "weather map", "get money"]:
        previous.stats(index, index.term_ids(query), 16)
    warmed, asked = TextMemo(), []

    made = warmed.warm(index, previous.recent(10), lambda: len(asked.append(1) or asked) <= 1)

    assert made == 1 and len(warmed) == 1
