"""A query text's BM25 figures over a large catalog, remembered: what a candidate-only search
needs of them.

A search that scores candidates only (:class:`capdisc.retrieval.index.RetrievalIndex` with its
graph) needs three things from a text's BM25 scores: their catalog mean and deviation (so a
candidate's z-score equals the full pass's), the best matching rows (lexical candidates), and
the scores of the few candidate rows. The first two take a pass over a score row of the
catalog's length, which at 1,000,000 capabilities is most of a turn; they depend on the text
and the catalog alone, so they are computed once per text and remembered
(:class:`TextMemo`, like the text's embedding, terms and name keys), the best rows as the
catalog's :data:`KEPT_FACTOR` times what a search asks, best first. A search takes the first
allowed ones (exact whenever enough of the kept rows are allowed, or every matching row was
kept; otherwise the row is scored again). The candidates' own scores are read from the
documents' side (:func:`scores_at`): their terms and counts, the weights the postings hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from capdisc.retrieval.lexical import (
    Ids32,
    IntArray,
    LexicalIndex,
    Scores,
    bm25_weights,
    run_positions,
)
from capdisc.retrieval.topk import BoolArray, best_matching

#: Texts a memo remembers (all forgotten at once when full): about 6 KB each with the
#: default 512 kept rows, so at most 24 MB an index.
TEXTS_REMEMBERED = 4096
#: A text's best rows kept: this many times the rows a search asks for, so a search that
#: admits most rows finds enough of them allowed.
KEPT_FACTOR = 4


@dataclass(frozen=True)
class TextStats:
    """One text's BM25 figures over every catalog row: the sum of its scores and of their
    squares, and its best matching rows, best first (``complete``: they are every row it
    matches)."""

    total: float
    square_total: float
    best: Ids32
    complete: bool
    #: The best rows in row order, and their scores: a candidate among them is not read again.
    kept_rows: Ids32
    kept_scores: Scores
    #: How many best rows were asked for (``best`` holds fewer when ``complete``).
    kept: int

    @classmethod
    def of(cls, row: Scores, total: float, kept: int) -> TextStats:
        """The figures of score row ``row`` (whose sum is ``total``), ``kept`` best rows."""
        everyone = np.ones(row.size, dtype=bool)
        best = best_matching(row, everyone, kept).astype(np.int32)  # 32-bit, as postings
        best = best[np.argsort(-row[best], kind="stable")]
        complete = best.size < kept  # fewer came back: every matching row did
        in_order = np.sort(best)
        square = float(np.dot(row, row))
        return cls(total, square, best, complete, in_order, row[in_order], kept)

    def known(self, rows: IntArray) -> tuple[BoolArray, Scores]:
        """Which of ``rows`` were kept, and their scores (0 for the others)."""
        if not self.kept_rows.size:
            return np.zeros(rows.size, dtype=bool), np.zeros(rows.size, dtype=np.float32)
        at = np.minimum(np.searchsorted(self.kept_rows, rows), self.kept_rows.size - 1)
        found = self.kept_rows[at] == rows
        return found, np.where(found, self.kept_scores[at], np.float32(0.0))

    def matching(self, allowed: BoolArray, k: int) -> Ids32 | None:
        """The ``k`` best ``allowed`` matching rows, best first (fewer when fewer match);
        None when the kept rows cannot tell."""
        picked: Ids32 = self.best[allowed[self.best]][:k]
        return picked if picked.size == k or self.complete else None


class TextMemo:
    """Per query text (its term ids), its :class:`TextStats` over one lexicon, for up to
    :data:`TEXTS_REMEMBERED` texts."""

    def __init__(self) -> None:
        self._stats: dict[bytes, TextStats] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._stats)

    def forget(self) -> None:
        """Forget every text (the next search of each scores its row again)."""
        with self._lock:
            self._stats.clear()

    def recent(self, limit: int) -> list[tuple[IntArray, int]]:
        """Up to ``limit`` remembered texts, the latest remembered last: each text's term ids
        and the best rows it kept (what :meth:`warm` takes)."""
        with self._lock:
            latest = list(self._stats.items())[-limit:] if limit > 0 else []
        return [(np.frombuffer(key, dtype=np.int64), stats.kept) for key, stats in latest]

    def warm(
        self,
        lexicon: LexicalIndex,
        texts: Sequence[tuple[IntArray, int]],
        go_on: Callable[[], bool] = lambda: True,
    ) -> int:
        """Remember ``texts``' figures over ``lexicon`` (term ids and rows to keep, as
        :meth:`recent` gives another memo's), stopping early once ``go_on`` says no; how many
        were computed (those already remembered cost nothing)."""
        made = 0
        for term_ids, kept in texts:
            if not go_on():
                break
            if _key(term_ids) not in self._stats:
                self.stats(lexicon, term_ids, kept)
                made += 1
        return made

    def stats(self, lexicon: LexicalIndex, term_ids: IntArray, kept: int) -> TextStats:
        """``term_ids``'s figures with at least ``kept`` best rows, remembered."""
        key = _key(term_ids)
        found = self._stats.get(key)
        if found is not None and (found.best.size >= kept or found.complete):
            return found
        row = lexicon.scores(term_ids)
        made = TextStats.of(row, float(lexicon.score_sums([term_ids])[0]), kept)
        with self._lock:
            if len(self._stats) >= TEXTS_REMEMBERED:
                self._stats.clear()
            self._stats[key] = made
        return made


def _key(term_ids: IntArray) -> bytes:
    """A text's key in a memo: its term ids as 64-bit integers (:meth:`TextMemo.recent` reads
    them back)."""
    return np.asarray(term_ids, dtype=np.int64).tobytes()


def scores_at(lexicon: LexicalIndex, queries: Sequence[IntArray], rows: IntArray) -> Scores:
    """Each query's BM25 scores of ``rows`` (one row of the result per query), read from the
    documents' terms and counts: the same weights the postings hold."""
    asked = sorted({term for query in queries for term in query.tolist()})
    if not rows.size or not asked:
        return np.zeros((len(queries), rows.size), dtype=np.float32)
    slot_of = np.full(lexicon.idf.size, -1, dtype=np.int32)  # term -> its column, or -1
    slot_of[asked] = np.arange(len(asked), dtype=np.int32)
    member = np.zeros((len(queries), len(asked)), dtype=np.float32)
    for at, query in enumerate(queries):
        member[at, slot_of[query]] = 1.0
    starts = lexicon.doc_indptr[rows]
    lengths = lexicon.doc_indptr[rows + 1] - starts
    positions = run_positions(starts, lengths)
    present = lexicon.doc_terms[positions]
    slots = slot_of[present]
    hit = np.flatnonzero(slots >= 0)
    owners = np.repeat(np.arange(rows.size), lengths)[hit]
    norm = lexicon.norm_at(rows)[owners]
    weights = bm25_weights(lexicon.idf, present[hit], lexicon.doc_tf[positions[hit]], norm)
    cells = np.zeros((rows.size, len(asked)), dtype=np.float32)
    cells[owners, slots[hit]] = weights  # a document holds a term once
    result: Scores = member @ cells.T
    return result
