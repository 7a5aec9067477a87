"""Lexical search: BM25 over capability text, with a tokenizer made for tool text.

Tool text mixes prose with identifiers (``getWeatherForecast``, ``list_pull_requests``,
``kubernetes-get-pods``): the tokenizer splits identifiers into words, lowercases, drops English
function words and request chatter, and stems with Snowball English when ``PyStemmer`` is
installed (it measurably helps: see ``docs/benchmarks.md``). Queries and documents go through the
same :func:`tokenize`.

:class:`LexicalIndex` is immutable. It builds the eager BM25 score matrix once (the scores
``bm25s`` computes, from per-document term counts it keeps, so an update re-tokenizes only what
changed), then scores a query in one vectorized pass over the postings of its terms
(``np.add.at``; the few terms in a large share of the documents add a dense row each instead),
returning a dense score row for the whole catalog so it can be fused with dense scores.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Protocol

import numpy as np
import numpy.typing as npt

from capdisc.captable import dense_strings, runs

Scores = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
#: Row and term ids inside the postings: 32 bits (a catalog has fewer than 2**31 rows and
#: terms), half the memory of the postings and the per-document terms.
Ids32 = npt.NDArray[np.int32]

#: Postings a delta's arithmetic handles at a time (:func:`_chunks`): 4 MB per float32 array.
CHUNK = 1 << 20
#: A term in more than this share of the documents also gets its weights as one dense row
#: (:attr:`LexicalIndex.dense_rows`): adding a row of the catalog's length is several times
#: cheaper than gathering and counting that many postings. At most :data:`DENSE_TERMS` terms,
#: the most frequent, so the rows cost at most 128 bytes a document.
DENSE_SHARE = 0.1
DENSE_TERMS = 32
#: A query's postings average this many entries a term or more: copied as slices, not gathered
#: (:meth:`LexicalIndex.scores_many`; measured on 10,000 and 100,000 capabilities).
COPY_RUNS_FROM = 256
#: One word: an acronym (HTTP in HTTPServer), a capitalized or lowercase run, or digits. Letters
#: outside ASCII count as lowercase, so "Café" stays one word.
_WORD = re.compile(r"[A-Z]+(?![^\W\dA-Z_])|[A-Z]?[^\W\dA-Z_]+|[0-9]+")

#: English function words and request chatter ("can you please ..."). Direction and state words
#: that name what a tool does (up, down, on, off, out, over, before, after) are kept.
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "again",
        "against",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "aren",
        "as",
        "at",
        "be",
        "because",
        "been",
        "being",
        "both",
        "but",
        "by",
        "can",
        "could",
        "couldn",
        "d",
        "did",
        "didn",
        "do",
        "does",
        "doesn",
        "doing",
        "don",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "hadn",
        "has",
        "hasn",
        "have",
        "haven",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "isn",
        "it",
        "its",
        "itself",
        "just",
        "ll",
        "m",
        "ma",
        "me",
        "might",
        "mightn",
        "more",
        "most",
        "must",
        "mustn",
        "my",
        "myself",
        "needn",
        "no",
        "nor",
        "not",
        "now",
        "o",
        "of",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "own",
        "please",
        "re",
        "s",
        "same",
        "shan",
        "she",
        "should",
        "shouldn",
        "so",
        "some",
        "such",
        "t",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "until",
        "ve",
        "very",
        "was",
        "wasn",
        "we",
        "were",
        "weren",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "won",
        "would",
        "wouldn",
        "y",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "thank",
        "thanks",
        "kindly",
    ]
)


class _Stemmer(Protocol):
    def stemWords(self, words: Sequence[str]) -> list[str]: ...


@lru_cache(maxsize=1)
def _english_stemmer() -> _Stemmer | None:
    try:
        import Stemmer
    except ImportError:  # PyStemmer is optional: without it tokens are left unstemmed
        return None
    stemmer: _Stemmer = Stemmer.Stemmer("english")
    return stemmer


def stemming_available() -> bool:
    """Whether Snowball stemming (``PyStemmer``) is installed."""
    return _english_stemmer() is not None


def words(text: str) -> list[str]:
    """Lowercased words of ``text`` with identifiers split, stop words kept."""
    return [w.lower() for w in _WORD.findall(text)]


def tokenize(text: str, *, stem: bool = True) -> list[str]:
    """The BM25 terms of ``text``: split identifiers, lowercase, no stop words, stemmed."""
    terms = [w for w in words(text) if w not in STOPWORDS]
    stemmer = _english_stemmer() if stem else None
    return stemmer.stemWords(terms) if stemmer is not None and terms else terms


def index_terms(text: str, *, stem: bool = True) -> list[str]:
    """What BM25 indexes and matches: the :func:`tokenize` terms and their adjacent pairs
    (``thyroid_function``), so a phrase outscores its words scattered over a document."""
    terms = tokenize(text, stem=stem)
    return terms + [f"{a}_{b}" for a, b in itertools.pairwise(terms)]


@lru_cache(maxsize=4096)
def query_terms(query: str, stem: bool) -> tuple[str, ...]:
    """:func:`index_terms` of a query, memoized as the query's parts and embedding are: a
    repeated turn tokenizes nothing (documents go through :func:`index_terms` uncached)."""
    return tuple(index_terms(query, stem=stem))


@dataclass(frozen=True)
class LexicalIndex:
    """BM25 over one document per capability, rows aligned with the caller's order.

    Scores are BM25's Lucene variant, the same numbers ``bm25s`` computes (a unit test holds
    the two to each other), built here with numpy from per-document term counts that are kept,
    so :meth:`build` with ``previous`` re-tokenizes only the documents that changed.
    """

    vocabulary: dict[str, int]
    data: Scores
    indices: Ids32
    indptr: IntArray
    num_docs: int
    stem: bool
    #: ``idf[t]``: inverse document frequency of term ``t`` (the confidence features use it).
    idf: Scores
    #: The transpose of the postings: document ``d``'s term ids are
    #: ``doc_terms[doc_indptr[d]:doc_indptr[d + 1]]``, with their counts in ``doc_tf``.
    doc_indptr: IntArray
    doc_terms: Ids32
    doc_tf: Scores = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    #: Terms per document (BM25's document length).
    doc_len: Scores = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    k1: float = 1.5
    b: float = 0.75
    #: The most frequent terms (:data:`DENSE_SHARE`, :data:`DENSE_TERMS`), sorted, each one's
    #: weight in every document as one row of ``dense_rows`` (0 where it is absent) and its
    #: document frequency in ``dense_df``. Their postings are not kept (``indptr`` gives
    #: them none): a query scores them by adding rows, the other terms through postings.
    dense_terms: Ids32 = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    dense_rows: npt.NDArray[np.float32] = field(
        default_factory=lambda: np.zeros((0, 0), dtype=np.float32)
    )
    dense_df: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Per term asked for so far, the sum of its weights over every document
    #: (:meth:`score_sums`); not copied by ``replace``.
    _term_sums: dict[int, float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        documents: Sequence[str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stem: bool = True,
        previous: LexicalIndex | None = None,
        reuse: Sequence[int | None] | None = None,
    ) -> LexicalIndex:
        """Index ``documents`` (one text per capability) with BM25 (Lucene variant).

        With ``previous`` and ``reuse``, document ``i`` whose ``reuse[i]`` is a row of
        ``previous`` takes that row's terms instead of tokenizing ``documents[i]`` again; when
        the reused rows keep their order (a delta's do), the postings are updated in place of
        being sorted again (:func:`_updated`: the same index, at a fraction of the work)."""
        if previous is not None and previous.num_docs and reuse is not None:
            picks = np.fromiter((-1 if r is None else r for r in reuse), np.int64, len(reuse))
            kept = picks[picks >= 0]
            if bool(np.all(kept[1:] > kept[:-1])):
                updated = _updated(previous, documents, picks)
                if updated is not None:
                    return updated
        vocab: dict[str, int] = dict(previous.vocabulary) if previous is not None else {}
        parts: list[tuple[npt.NDArray[np.integer], Scores, float]] = []
        for row, doc in enumerate(documents):
            old = reuse[row] if reuse is not None and previous is not None else None
            parts.append(
                previous.row_terms(old)
                if previous is not None and old is not None
                else _counted(index_terms(doc, stem=stem) or [""], vocab)
            )
        if previous is None:
            vocab = _dense_vocabulary(vocab)
        return cls._assemble(vocab, parts, stem, k1, b)

    @classmethod
    def _assemble(
        cls,
        vocab: dict[str, int],
        parts: list[tuple[npt.NDArray[np.integer], Scores, float]],
        stem: bool,
        k1: float,
        b: float,
    ) -> LexicalIndex:
        n = len(parts)
        lengths = np.fromiter((len(t) for t, _c, _l in parts), dtype=np.int64, count=n)
        doc_indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        empty_i, empty_f = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        doc_terms = (
            np.concatenate([t for t, _c, _l in parts]).astype(np.int32, copy=False)
            if n
            else empty_i
        )
        doc_tf = np.concatenate([c for _t, c, _l in parts]) if n else empty_f
        doc_len = np.fromiter((dl for _t, _c, dl in parts), dtype=np.float32, count=n)
        df = np.bincount(doc_terms, minlength=len(vocab))
        idf = _idf(df, n)
        owners = np.repeat(np.arange(n, dtype=np.int32), lengths)
        weights = bm25_weights(idf, doc_terms, doc_tf, _norm(doc_len, k1, b)[owners])
        by_term = np.argsort(doc_terms, kind="stable")
        indptr = np.concatenate(([0], np.cumsum(df))).astype(np.int64)
        made = cls(
            vocab,
            weights[by_term],
            owners[by_term],
            indptr,
            n,
            stem,
            idf,
            doc_indptr,
            doc_terms,
            doc_tf,
            doc_len,
            k1,
            b,
        )
        return made.with_dense_rows()

    def with_dense_rows(self) -> LexicalIndex:
        """This index, which keeps every term's postings, with its most frequent terms moved
        to :attr:`dense_rows` (their postings dropped: a row of 4 bytes a document is up to
        5 times the 8-byte postings of a term in 10% of them, and cheaper from half of them
        up; the cap of :data:`DENSE_TERMS` bounds it at 128 bytes a document)."""
        if self.dense_terms.size:
            return self
        df = np.diff(self.indptr)
        frequent = _frequent_terms(df, self.num_docs)
        rows = np.zeros((len(frequent), self.num_docs), dtype=np.float32)
        for slot, term in enumerate(frequent.tolist()):
            at = slice(int(self.indptr[term]), int(self.indptr[term + 1]))
            rows[slot, self.indices[at]] = self.data[at]
        kept_df = df.copy()
        kept_df[frequent] = 0
        kept = np.repeat(kept_df > 0, df) if frequent.size else slice(None)
        return replace(
            self,
            data=self.data[kept],
            indices=self.indices[kept],
            indptr=np.concatenate(([0], np.cumsum(kept_df))).astype(np.int64),
            dense_terms=frequent,
            dense_rows=rows,
            dense_df=df[frequent].astype(np.int64),
        )

    def posting_runs(self) -> Iterator[tuple[Ids32, Ids32, Scores]]:
        """Every term's postings in term order, a run at a time (each posting's term, row and
        weight): the kept postings between two dense rows' terms as one run, each dense row's
        as another. What :meth:`postings` concatenates, without holding it all at once."""
        start_term = 0
        dense = zip(self.dense_terms.tolist(), self.dense_rows, strict=True)
        for term, row in [*dense, (len(self.indptr) - 1, None)]:
            at = slice(int(self.indptr[start_term]), int(self.indptr[term]))
            counts = np.diff(self.indptr[start_term : term + 1])
            yield (
                np.repeat(np.arange(start_term, term, dtype=np.int32), counts),
                self.indices[at],
                self.data[at],
            )
            if row is not None:
                present = np.flatnonzero(row).astype(np.int32)
                yield np.full(present.size, term, dtype=np.int32), present, row[present]
            start_term = term + 1

    def postings(self) -> tuple[Scores, Ids32, IntArray]:
        """Every term's postings (weights, rows, offsets by term), the dense rows' terms
        among them: what :meth:`with_dense_rows` was made from."""
        if not self.dense_terms.size:
            return self.data, self.indices, self.indptr
        runs = list(self.posting_runs())
        df = np.diff(self.indptr)
        df[self.dense_terms] = self.dense_df
        return (
            np.concatenate([weights for _terms, _rows, weights in runs]),
            np.concatenate([rows for _terms, rows, _weights in runs]),
            np.concatenate(([0], np.cumsum(df))).astype(np.int64),
        )

    def _df(self, term_id: int) -> int:
        """How many documents hold term ``term_id``."""
        if self.dense_terms.size:
            slot = int(np.searchsorted(self.dense_terms, term_id))
            if slot < self.dense_terms.size and int(self.dense_terms[slot]) == term_id:
                return int(self.dense_df[slot])
        return int(self.indptr[term_id + 1] - self.indptr[term_id])

    def row_terms(self, row: int) -> tuple[Ids32, Scores, float]:
        """Document ``row``'s distinct term ids, their counts and its length."""
        start, end = self.doc_indptr[row], self.doc_indptr[row + 1]
        return self.doc_terms[start:end], self.doc_tf[start:end], float(self.doc_len[row])

    def term_ids(self, query: str) -> IntArray:
        """Vocabulary ids of the distinct terms of ``query`` (unknown terms left out)."""
        seen: dict[int, None] = {}
        for term in query_terms(query, self.stem):
            term_id = self.vocabulary.get(term)
            if term_id is not None and term:
                seen.setdefault(term_id)
        return np.fromiter(seen, dtype=np.int64, count=len(seen))

    def scores(self, term_ids: IntArray) -> Scores:
        """BM25 score of every document for a query given as :meth:`term_ids`."""
        row: Scores = self.scores_many([term_ids])[0]
        return row

    def scores_many(self, queries: Sequence[IntArray]) -> npt.NDArray[np.float32]:
        """BM25 scores of several queries at once: one row per query (the dense rows of their
        frequent terms summed, then the postings of the others added with ``np.add.at``).

        Short postings (a small catalog's) are gathered for every term at once; long ones are
        copied a term at a time, which beats an element-by-element gather once a term's
        postings run to :data:`COPY_RUNS_FROM` entries on average."""
        n = self.num_docs
        if not queries:
            return np.zeros((0, n), dtype=np.float32)
        sparse, dense = self._split(queries)
        terms = np.concatenate([np.zeros(0, dtype=np.int64), *sparse])
        starts = self.indptr[terms]
        lengths = self.indptr[terms + 1] - starts
        flat = self._dense_sums(dense, n)
        if int(lengths.sum()) < COPY_RUNS_FROM * terms.size:
            self._add_gathered(flat, _sizes(sparse), starts, lengths)
        else:
            self._add_copied(flat, _sizes(sparse), starts, lengths)
        result: npt.NDArray[np.float32] = flat.reshape(len(queries), n)
        return result

    def _add_gathered(
        self, flat: Scores, sizes: list[int], starts: IntArray, lengths: IntArray
    ) -> None:
        """Add the postings of every query's terms (``sizes[q]`` of them for query ``q``, their
        runs at ``starts``) to ``flat``, query ``q``'s row at ``q * num_docs``."""
        positions = run_positions(starts, lengths)
        targets = self.indices[positions]
        if len(sizes) > 1:
            offsets = np.repeat(np.arange(len(sizes), dtype=np.int64) * self.num_docs, sizes)
            targets = targets + np.repeat(offsets, lengths)
        np.add.at(flat, targets, self.data[positions])  # in float32: no float64 row to convert

    def _add_copied(
        self, flat: Scores, sizes: list[int], starts: IntArray, lengths: IntArray
    ) -> None:
        """:meth:`_add_gathered`, each term's run copied as a slice, one query at a time."""
        n = self.num_docs
        spans = [slice(a, a + b) for a, b in zip(starts.tolist(), lengths.tolist(), strict=True)]
        first = 0
        for query, size in enumerate(sizes):
            mine, first = spans[first : first + size], first + size
            if mine:
                targets = np.concatenate([self.indices[span] for span in mine])
                weights = np.concatenate([self.data[span] for span in mine])
                np.add.at(flat[query * n : (query + 1) * n], targets, weights)

    def _dense_sums(self, dense: list[IntArray], n: int) -> npt.NDArray[np.float32]:
        """One row of ``n`` per query, end to end: the sum of its dense rows (zeros for a
        query without any), written in place rather than added to a row of zeros."""
        flat = np.empty(len(dense) * n, dtype=np.float32)
        for query, slots in enumerate(dense):
            row = flat[query * n : (query + 1) * n]
            picks = slots.tolist()
            if not picks:
                row.fill(0.0)
                continue
            np.copyto(row, self.dense_rows[picks[0]])
            for slot in picks[1:]:
                row += self.dense_rows[slot]
        return flat

    def score_sums(self, queries: Sequence[IntArray]) -> npt.NDArray[np.float64]:
        """Per query (:meth:`term_ids`), the sum of its BM25 scores over every document, in
        double precision: its terms' weight sums, each counted once from that term's postings
        or dense row and then remembered (a query's catalog mean without a pass over its
        scores)."""
        return np.array(
            [sum(self._term_sum(term) for term in query.tolist()) for query in queries],
            dtype=np.float64,
        )

    def _term_sum(self, term: int) -> float:
        total = self._term_sums.get(term)
        if total is None:
            slot = int(np.searchsorted(self.dense_terms, term))
            if slot < self.dense_terms.size and int(self.dense_terms[slot]) == term:
                weights = self.dense_rows[slot]
            else:
                weights = self.data[int(self.indptr[term]) : int(self.indptr[term + 1])]
            total = float(weights.sum(dtype=np.float64))
            self._term_sums[term] = total
        return total

    @cached_property
    def mean_length(self) -> float:
        """The mean document length, as BM25's length normalization takes it (computed once)."""
        return _mean_length(self.doc_len)

    def terms_of(self, term_ids: IntArray) -> tuple[str, ...]:
        """The terms of vocabulary ids ``term_ids`` (:meth:`ids_of` reads them back in another
        lexicon, whose ids may differ)."""
        terms = self._terms
        return tuple(terms[i] for i in term_ids.tolist())

    def ids_of(self, terms: Sequence[str]) -> IntArray:
        """The vocabulary ids of ``terms``, in their order, unknown ones left out (as
        :meth:`term_ids` gives them for a text of those terms)."""
        found = [i for i in (self.vocabulary.get(t) for t in terms) if i is not None]
        return np.asarray(found, dtype=np.int64)

    @cached_property
    def _terms(self) -> list[str]:
        """Each vocabulary id's term (made on first use)."""
        terms = [""] * len(self.vocabulary)
        for term, term_id in self.vocabulary.items():
            terms[term_id] = term
        return terms

    def norm_at(self, rows: IntArray) -> Scores:
        """BM25's length normalization of documents ``rows`` (the numbers the postings'
        weights were made with: the mean length is the whole catalog's)."""
        return _norm(self.doc_len[rows], self.k1, self.b, self.mean_length)

    def _split(self, queries: Sequence[IntArray]) -> tuple[list[IntArray], list[IntArray]]:
        """Per query, its term ids scored through postings, and the :attr:`dense_rows` slots
        of the others."""
        sparse: list[IntArray] = []
        dense: list[IntArray] = []
        frequent = self.dense_terms
        for query in queries:
            ids = np.asarray(query, dtype=np.int64)
            if not frequent.size:
                sparse.append(ids)
                dense.append(ids[:0])
                continue
            slots = np.searchsorted(frequent, ids)
            hit = frequent[np.minimum(slots, frequent.size - 1)] == ids
            sparse.append(ids[~hit])
            dense.append(slots[hit])
        return sparse, dense

    def coverage(self, term_ids: IntArray, rows: Sequence[int]) -> Scores:
        """For each of ``rows``, the share of the query's IDF weight among the terms the
        document contains (1.0: it has every query term)."""
        covered: Scores = self.coverage_many([term_ids], np.asarray(rows, dtype=np.int64))[0]
        return covered

    def coverage_many(self, term_sets: Sequence[IntArray], rows: IntArray) -> Scores:
        """:meth:`coverage` of ``rows`` for each of ``term_sets`` (one row of the result per
        set; a term asked twice counts twice in its set's total), the documents' terms read
        once for all of them."""
        result = np.zeros((len(term_sets), rows.size), dtype=np.float32)
        asked = np.concatenate([np.zeros(0, dtype=np.int64), *term_sets])
        if not rows.size or not asked.size:
            return result
        owner = np.repeat(np.arange(len(term_sets)), _sizes(term_sets))
        union, slot = np.unique(asked, return_inverse=True)
        idf = self.idf[asked].astype(np.float64)
        totals = np.bincount(owner, weights=idf, minlength=len(term_sets))
        weights = np.zeros((len(term_sets), union.size), dtype=np.float64)
        counted = totals[owner] > 0.0
        weights[owner[counted], slot[counted]] = idf[counted] / totals[owner[counted]]
        starts, ends = self.doc_indptr[rows], self.doc_indptr[rows + 1]
        lengths = ends - starts
        present = self.doc_terms[run_positions(starts, lengths)]
        slots = np.minimum(np.searchsorted(union, present), union.size - 1)
        hit = union[slots] == present
        owners = np.repeat(np.arange(rows.size), lengths)[hit]
        cells = np.bincount(owners * union.size + slots[hit], minlength=rows.size * union.size)
        result[:] = weights @ cells.reshape(rows.size, union.size).T  # (sets, rows)
        return result

    def document_frequency(self, word: str) -> int:
        """How many documents contain ``word`` (after tokenization; 0 for a stop word)."""
        terms = tokenize(word, stem=self.stem)
        if len(terms) != 1 or terms[0] not in self.vocabulary:
            return 0
        return self._df(self.vocabulary[terms[0]])

    def document_frequencies(self, words: Sequence[str]) -> dict[str, int]:
        """:meth:`document_frequency` of many words at once (one stemmer call)."""
        distinct = list(dict.fromkeys(words))
        stemmer = _english_stemmer() if self.stem else None
        lowered = [w.lower() for w in distinct]
        stems = stemmer.stemWords(lowered) if stemmer is not None and lowered else lowered
        out = {}
        for word, low, term in zip(distinct, lowered, stems, strict=True):
            term_id = self.vocabulary.get(term) if low not in STOPWORDS else None
            out[word] = 0 if term_id is None else self._df(term_id)
        return out

    def search(self, query: str) -> Scores:
        """BM25 score of every document for ``query``."""
        return self.scores(self.term_ids(query))


def _sizes(arrays: Sequence[IntArray]) -> list[int]:
    return [array.size for array in arrays]


def run_positions(starts: IntArray, lengths: IntArray) -> IntArray:
    """``starts[i] .. starts[i] + lengths[i]`` for each ``i``, end to end."""
    positions = np.arange(int(lengths.sum()), dtype=np.int64)
    positions += np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return positions


def _frequent_terms(df: IntArray, n: int) -> Ids32:
    """The terms that get a dense row: in more than :data:`DENSE_SHARE` of ``n`` documents, the
    :data:`DENSE_TERMS` most frequent at most, sorted by id."""
    candidates = np.flatnonzero(df > DENSE_SHARE * n)
    if candidates.size > DENSE_TERMS:
        order = np.argsort(-df[candidates], kind="stable")[:DENSE_TERMS]
        candidates = candidates[order]
    return np.sort(candidates).astype(np.int32)


def _idf(df: IntArray, n: int) -> Scores:
    """BM25's (Lucene) inverse document frequency of terms in ``df`` of ``n`` documents."""
    idf: Scores = np.log(1.0 + (max(n, 1) - df + 0.5) / (df + 0.5)).astype(np.float32)
    return idf


def _mean_length(doc_len: Scores) -> float:
    return max(float(doc_len.mean()) if len(doc_len) else 1.0, 1e-9)


def _norm(doc_len: Scores, k1: float, b: float, mean: float | None = None) -> Scores:
    """Per document, BM25's length normalization ``k1 * (1 - b + b * len / mean len)``
    (``mean``: the mean length, when ``doc_len`` is not every document's)."""
    if mean is None:
        mean = _mean_length(doc_len)
    norm: Scores = (k1 * ((1.0 - b) + b * doc_len / mean)).astype(np.float32, copy=False)
    return norm


def bm25_weights(idf: Scores, terms: npt.NDArray[np.integer], tf: Scores, norm: Scores) -> Scores:
    """Each posting's BM25 weight (term ``terms[i]``, count ``tf[i]``, its document's
    ``norm[i]``), the same numbers in whatever order the postings come."""
    weights: Scores = (idf[terms] * tf / (tf + norm)).astype(np.float32)
    return weights


def _updated(
    previous: LexicalIndex, documents: Sequence[str], picks: IntArray
) -> LexicalIndex | None:
    """:meth:`LexicalIndex.build` of ``documents`` when row ``i`` keeps row ``picks[i]`` of
    ``previous`` (a negative pick: tokenize ``documents[i]``) and the kept rows are in their
    order: the kept postings stay sorted by term and row, so the new rows' postings are merged
    in and every weight is recomputed (the collection's statistics moved), without sorting
    every posting again. None when a kept posting's count cannot be read back exactly from its
    weight (then the caller builds afresh)."""
    vocab = dict(previous.vocabulary)
    fresh = np.flatnonzero(picks < 0)
    parts = [
        _counted(index_terms(documents[r], stem=previous.stem) or [""], vocab)
        for r in fresh.tolist()
    ]
    kept_terms, kept_rows, kept_tf = _kept_postings(previous, picks)
    if kept_tf is None:
        return None
    new_terms = np.concatenate([t for t, _c, _l in parts]) if parts else np.zeros(0, np.int64)
    sizes = [len(t) for t, _c, _l in parts]
    new_rows = np.repeat(fresh, sizes).astype(np.int64)
    new_tf = np.concatenate([c for _t, c, _l in parts]) if parts else np.zeros(0, np.float32)
    n = len(picks)
    order = np.lexsort((new_rows, new_terms))
    places = np.searchsorted(
        kept_terms.astype(np.int64) * n + kept_rows, new_terms[order] * n + new_rows[order]
    )
    terms = np.insert(kept_terms, places, new_terms[order].astype(np.int32))
    owners = np.insert(kept_rows, places, new_rows[order].astype(np.int32))
    tf = np.insert(kept_tf, places, new_tf[order])
    doc_indptr, doc_terms, doc_tf, doc_len = _doc_side(previous, picks, fresh, parts)
    df = np.bincount(terms, minlength=len(vocab))
    idf = _idf(df, n)
    norm = _norm(doc_len, previous.k1, previous.b)
    weights = np.empty(len(terms), dtype=np.float32)
    for at in _chunks(len(terms)):
        weights[at] = bm25_weights(idf, terms[at], tf[at], norm[owners[at]])
    updated = LexicalIndex(
        vocab,
        weights,
        owners,
        np.concatenate(([0], np.cumsum(df))).astype(np.int64),
        n,
        previous.stem,
        idf,
        doc_indptr,
        doc_terms,
        doc_tf,
        doc_len,
        previous.k1,
        previous.b,
    )
    return updated.with_dense_rows()


def _kept_postings(previous: LexicalIndex, picks: IntArray) -> tuple[Ids32, Ids32, Scores | None]:
    """The postings of ``previous``'s kept rows, in its order (by term, then row): their term
    ids, their new rows, and their counts, read back from the weights (None when one does not
    come back a whole number)."""
    moved = np.full(previous.num_docs, -1, dtype=np.int32)
    kept = np.flatnonzero(picks >= 0)
    moved[picks[kept]] = kept
    run_terms: list[Ids32] = []
    run_old: list[Ids32] = []
    run_new: list[Ids32] = []
    run_weights: list[Scores] = []
    for terms_of, rows_of, weights_of in previous.posting_runs():
        new_rows = moved[rows_of]
        keep = new_rows >= 0
        run_terms.append(terms_of[keep])
        run_old.append(rows_of[keep])
        run_new.append(new_rows[keep])
        run_weights.append(weights_of[keep])
    terms, old_rows, rows = (
        np.concatenate(run_terms),
        np.concatenate(run_old),
        np.concatenate(run_new),
    )
    weights = np.concatenate(run_weights)
    del run_terms, run_old, run_new, run_weights
    norm = _norm(previous.doc_len, previous.k1, previous.b)
    tf = np.empty(len(weights), dtype=np.float32)
    for at in _chunks(len(weights)):
        part = weights[at].astype(np.float64)
        counts = part * norm[old_rows[at]] / (previous.idf[terms[at]] - part)
        whole = np.rint(counts)
        if not (np.all(np.isfinite(counts)) and np.all(np.abs(counts - whole) < 0.01)):
            return terms, rows, None
        tf[at] = whole
    return terms, rows, tf


def _chunks(size: int) -> Iterator[slice]:
    """Slices of :data:`CHUNK` postings covering ``size``: arithmetic over every posting is
    done a chunk at a time, so its temporaries stay small."""
    for start in range(0, size, CHUNK):
        yield slice(start, min(start + CHUNK, size))


def _doc_side(
    previous: LexicalIndex,
    picks: IntArray,
    fresh: IntArray,
    parts: list[tuple[IntArray, Scores, float]],
) -> tuple[IntArray, Ids32, Scores, Scores]:
    """The per-document arrays (offsets, term ids, counts, lengths) of the rows ``picks``
    names: runs of kept rows copied as one slice each, the new rows' ``parts`` between."""
    terms: list[npt.NDArray[np.integer]] = []
    counts: list[Scores] = []
    fresh_at = {int(row): i for i, row in enumerate(fresh)}
    for start, end in runs(picks):
        if picks[start] < 0:
            new_terms, new_tf, _length = parts[fresh_at[start]]
            terms.append(new_terms)
            counts.append(new_tf)
        else:
            lo = previous.doc_indptr[picks[start]]
            hi = previous.doc_indptr[picks[end - 1] + 1]
            terms.append(previous.doc_terms[lo:hi])
            counts.append(previous.doc_tf[lo:hi])
    lengths = np.diff(previous.doc_indptr)[np.maximum(picks, 0)]
    lengths[fresh] = [len(t) for t, _c, _l in parts]
    doc_len = previous.doc_len[np.maximum(picks, 0)].astype(np.float32)
    doc_len[fresh] = [length for _t, _c, length in parts]
    doc_indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    doc_terms = np.concatenate(terms).astype(np.int32) if terms else np.zeros(0, np.int32)
    doc_tf = np.concatenate(counts).astype(np.float32) if counts else np.zeros(0, np.float32)
    return doc_indptr, doc_terms, doc_tf, doc_len


def _dense_vocabulary(vocab: dict[str, int]) -> dict[str, int]:
    """``vocab`` with its terms copied side by side (:func:`capdisc.captable.dense_strings`),
    when its ids are 0..n-1 in order (as :meth:`LexicalIndex.build` makes them). Only for a
    vocabulary built afresh: a delta's holds its predecessor's terms, side by side already."""
    if list(vocab.values()) != list(range(len(vocab))):
        return vocab
    return dict(zip(dense_strings(vocab), range(len(vocab)), strict=True))


def _counted(terms: list[str], vocab: dict[str, int]) -> tuple[IntArray, Scores, float]:
    """Distinct term ids of ``terms`` (new ones added to ``vocab``), counts and length."""
    counts = Counter(terms)  # counted first, so each distinct term is looked up once
    ids = np.fromiter(
        (vocab.setdefault(term, len(vocab)) for term in counts), dtype=np.int64, count=len(counts)
    )
    tf = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    return ids, tf, float(len(terms))
