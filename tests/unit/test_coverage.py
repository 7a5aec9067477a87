"""The lexical side damped by coverage: the policy as a table, which rows are read, and the
coverage of a decomposed request."""

from __future__ import annotations

import numpy as np
import pytest

from capdisc.retrieval.coverage import damp_uncovered, damped_scores, part_coverage
from capdisc.retrieval.lexical import LexicalIndex
from capdisc.retrieval.results import Scored, best_rows
from capdisc.retrieval.scoring import LexicalScores, LexicalSide


@pytest.mark.parametrize(
    ("fused", "lexical", "coverage", "power", "expected"),
    [
        (5.0, 4.0, 1.0, 0.5, 5.0),  # covers the whole request: kept
        (5.0, 4.0, 0.25, 0.5, 3.0),  # a quarter: half its lexical part kept
        (5.0, 4.0, 0.0, 0.5, 1.0),  # no coverage: the lexical part is gone
        (5.0, 4.0, 0.25, 1.0, 2.0),  # linear
        (5.0, 4.0, 0.25, 0.0, 5.0),  # power 0: off
        (-1.0, -0.5, 0.0, 0.5, -1.0),  # shares no word: its negative lexical z stays
    ],
)
def test_damped_scores_keep_the_covered_share_of_a_positive_lexical_part(
    fused: float, lexical: float, coverage: float, power: float, expected: float
) -> None:
    got = damped_scores(
        np.array([fused], np.float32),
        np.array([lexical], np.float32),
        np.array([coverage], np.float32),
        power,
    )
    assert float(got[0]) == pytest.approx(expected, abs=1e-6)


def _scored(rows: np.ndarray | None = None) -> Scored:
    """Four catalog rows: 0 matches one rare query word, 1 is near in meaning, 2 covers the
    request's words, 3 shares nothing."""
    bm25 = np.array([[9.0, 0.0, 9.0, 0.0]], dtype=np.float32)
    moments = (np.zeros(1), np.ones(1))
    scores = LexicalScores([np.zeros(0, np.int64)], moments, np.ones(4, dtype=bool), bm25)
    side = LexicalSide(scores, 0.0, 0.5)
    at = np.arange(4) if rows is None else rows
    cosine = np.array([0.1, 0.6, 0.3, 0.0], dtype=np.float32)[at]
    fused = (cosine * 5 + side.contribution(at)).astype(np.float32)
    return Scored(rows, cosine, fused, np.zeros(0, np.int64), side)


COVERAGE = np.array([0.05, 0.0, 0.9, 0.0], dtype=np.float32)


def test_a_row_matching_one_word_falls_below_one_near_in_meaning() -> None:
    scored = _scored()
    allowed = np.ones(4, dtype=bool)
    assert best_rows(scored, allowed, 3) == [2, 0, 1]

    damped = damp_uncovered(scored, allowed, lambda rows: COVERAGE[rows], 0.5)

    assert best_rows(damped, allowed, 3) == [2, 1, 0]


@pytest.mark.parametrize("rows", [None, np.array([0, 1, 2, 3])])
def test_rows_read_get_their_damped_score_and_the_rest_lose_their_lexical_part(
    rows: np.ndarray | None,
) -> None:
    scored = _scored(rows)
    allowed = np.ones(4, dtype=bool)
    side = scored.lexical
    assert side is not None

    damped = damp_uncovered(scored, allowed, lambda r: COVERAGE[r], 0.5, pool=1)

    read = [2]  # the best by fused score
    expected = damped_scores(
        scored.fused[read], side.contribution(np.array(read)), COVERAGE[read], 0.5
    )
    assert damped.fused[read] == pytest.approx(expected)
    assert damped.fused[0] == pytest.approx(scored.fused[0] - side.contribution(np.array([0]))[0])
    assert damped.fused[1] == pytest.approx(scored.fused[1])  # no lexical part to lose
    assert damped.fused[3] == pytest.approx(scored.fused[3])


def test_damping_without_a_lexical_side_changes_nothing() -> None:
    scored = _scored()
    plain = Scored(None, scored.cosine, scored.fused, scored.term_ids)

    assert damp_uncovered(plain, np.ones(4, dtype=bool), lambda rows: rows * 0.0, 0.5) is plain


def test_coverage_is_that_of_the_best_covered_part() -> None:
    lexicon = LexicalIndex.build(
        ["read a file from disk", "post a message to a slack channel", "weather forecast"]
    )
    whole = lexicon.term_ids("read notes file and post message to slack")
    parts = [lexicon.term_ids("read notes file"), lexicon.term_ids("post message to slack")]

    alone = part_coverage(lexicon, [whole])(np.arange(3))
    by_part = part_coverage(lexicon, [whole, *parts])(np.arange(3))

    assert by_part[0] > alone[0] and by_part[1] > alone[1]
    assert by_part[2] == alone[2] == 0.0


def test_coverage_of_several_sets_equals_each_set_alone() -> None:
    lexicon = LexicalIndex.build(
        ["read a file from disk", "post a message to a slack channel", "slack file upload", "x"]
    )
    sets = [lexicon.term_ids(text) for text in ("read file slack", "post slack slack", "nothing")]
    rows = np.array([3, 0, 2, 1], dtype=np.int64)

    many = lexicon.coverage_many(sets, rows)

    for at, terms in enumerate(sets):
        assert many[at] == pytest.approx(lexicon.coverage(terms, rows.tolist()), abs=1e-6)


def test_coverage_asked_again_answers_as_the_first_time() -> None:
    lexicon = LexicalIndex.build(
        ["read a file from disk", "post a message to a slack channel", "slack file upload", "x"]
    )
    sets = [lexicon.term_ids("read file and post to slack"), lexicon.term_ids("post to slack")]
    coverage = part_coverage(lexicon, sets)

    first = coverage(np.array([2, 0], dtype=np.int64))
    again = coverage(np.array([0, 1, 2, 3], dtype=np.int64))

    fresh = part_coverage(lexicon, sets)(np.array([0, 1, 2, 3], dtype=np.int64))
    np.testing.assert_allclose(again, fresh)
    np.testing.assert_allclose(first, fresh[[2, 0]])
