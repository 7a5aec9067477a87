"""Lexical search: BM25 (``bm25s``) over capability text, with a tokenizer made for tool text.

Tool text mixes prose with identifiers (``getWeatherForecast``, ``list_pull_requests``,
``kubernetes-get-pods``): the tokenizer splits identifiers into words, lowercases, drops English
function words and request chatter, and stems with Snowball English when ``PyStemmer`` is
installed (it measurably helps: see ``docs/benchmarks.md``). Queries and documents go through the
same :func:`tokenize`.

:class:`LexicalIndex` is immutable. It uses ``bm25s`` to build the eager BM25 score matrix once,
then scores a query in one vectorized pass over the postings of its terms (``np.bincount``),
returning a dense score row for the whole catalog so it can be fused with dense scores.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Scores = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
#: One word: an acronym (HTTP in HTTPServer), a capitalized or lowercase run, or digits. Letters
#: outside ASCII count as lowercase, so "Café" stays one word.
_WORD = re.compile(r"[A-Z]+(?![^\W\dA-Z_])|[A-Z]?[^\W\dA-Z_]+|[0-9]+")

#: English function words and request chatter ("can you please ..."). Direction and state words
#: that name what a tool does (up, down, on, off, out, over, before, after) are kept.
STOPWORDS = frozenset([
    "a", "about", "again", "against", "all", "also", "am", "an", "and", "any", "are", "aren",
    "as", "at", "be", "because", "been", "being", "both", "but", "by", "can", "could",
    "couldn", "d", "did", "didn", "do", "does", "doesn", "doing", "don", "each", "few", "for",
    "from", "further", "had", "hadn", "has", "hasn", "have", "haven", "having", "he", "her",
    "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is",
    "isn", "it", "its", "itself", "just", "ll", "m", "ma", "me", "might", "mightn", "more",
    "most", "must", "mustn", "my", "myself", "needn", "no", "nor", "not", "now", "o", "of",
    "once", "only", "or", "other", "our", "ours", "ourselves", "own", "please", "re", "s",
    "same", "shan", "she", "should", "shouldn", "so", "some", "such", "t", "than", "that",
    "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this",
    "those", "through", "to", "too", "until", "ve", "very", "was", "wasn", "we", "were",
    "weren", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
    "won", "would", "wouldn", "y", "you", "your", "yours", "yourself", "yourselves", "thank",
    "thanks", "kindly",
])


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


def split_identifiers(text: str) -> str:
    """``getWeatherForecast`` -> ``get Weather Forecast``; ``list_pull-requests`` -> words."""
    return " ".join(_CAMEL.sub(" ", word) for word in _TOKEN.findall(text))


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


@dataclass(frozen=True)
class LexicalIndex:
    """BM25 over one document per capability, rows aligned with the caller's order."""

    vocabulary: dict[str, int]
    data: Scores
    indices: IntArray
    indptr: IntArray
    num_docs: int
    stem: bool
    #: ``idf[t]``: inverse document frequency of term ``t`` (the confidence features use it).
    idf: Scores
    #: The transpose of the postings: document ``d``'s term ids are
    #: ``doc_terms[doc_indptr[d]:doc_indptr[d + 1]]``.
    doc_indptr: IntArray
    doc_terms: IntArray

    @classmethod
    def build(cls, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75,
              stem: bool = True) -> LexicalIndex:
        """Index ``documents`` (one text per capability) with BM25 (Lucene variant)."""
        import bm25s

        corpus = [index_terms(doc, stem=stem) or [""] for doc in documents]
        retriever: Any = bm25s.BM25(k1=k1, b=b, method="lucene")
        if documents:
            retriever.index(corpus, show_progress=False)
            scores = retriever.scores
            vocab: dict[str, int] = {str(k): int(v) for k, v in retriever.vocab_dict.items()}
            data = np.asarray(scores["data"], dtype=np.float32)
            indices = np.asarray(scores["indices"], dtype=np.int64)
            indptr = np.asarray(scores["indptr"], dtype=np.int64)
        else:
            vocab, data = {}, np.zeros(0, dtype=np.float32)
            indices, indptr = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        counts = np.diff(indptr)
        n = max(len(documents), 1)
        idf = np.log(1.0 + (n - counts + 0.5) / (counts + 0.5)).astype(np.float32)
        owners = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
        by_doc = np.argsort(indices, kind="stable")
        doc_indptr = np.concatenate(([0], np.cumsum(np.bincount(indices, minlength=len(
            documents))))).astype(np.int64)
        return cls(vocab, data, indices, indptr, len(documents), stem, idf, doc_indptr,
                   owners[by_doc])

    def term_ids(self, query: str) -> IntArray:
        """Vocabulary ids of the distinct terms of ``query`` (unknown terms left out)."""
        seen: dict[int, None] = {}
        for term in index_terms(query, stem=self.stem):
            term_id = self.vocabulary.get(term)
            if term_id is not None and term:
                seen.setdefault(term_id)
        return np.fromiter(seen, dtype=np.int64, count=len(seen))

    def scores(self, term_ids: IntArray) -> Scores:
        """BM25 score of every document for a query given as :meth:`term_ids`."""
        row: Scores = self.scores_many([term_ids])[0]
        return row

    def scores_many(self, queries: Sequence[IntArray]) -> npt.NDArray[np.float32]:
        """BM25 scores of several queries at once: one row per query (one ``bincount``)."""
        n = self.num_docs
        if not queries:
            return np.zeros((0, n), dtype=np.float32)
        term_ids = np.concatenate([np.asarray(q, dtype=np.int64) for q in queries])
        if term_ids.size == 0 or n == 0:
            return np.zeros((len(queries), n), dtype=np.float32)
        starts, ends = self.indptr[term_ids], self.indptr[term_ids + 1]
        lengths = ends - starts
        postings = np.arange(int(lengths.sum()), dtype=np.int64)
        postings += np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        query_of_term = np.repeat(np.arange(len(queries), dtype=np.int64),
                                  [len(q) for q in queries])
        targets = self.indices[postings] + np.repeat(query_of_term * n, lengths)
        flat = np.bincount(targets, weights=self.data[postings], minlength=len(queries) * n)
        result: npt.NDArray[np.float32] = flat.astype(np.float32).reshape(len(queries), n)
        return result

    def coverage(self, term_ids: IntArray, rows: Sequence[int]) -> Scores:
        """For each of ``rows``, the share of the query's IDF weight among the terms the
        document contains (1.0: it has every query term)."""
        result = np.zeros(len(rows), dtype=np.float32)
        total = float(self.idf[term_ids].sum()) if term_ids.size else 0.0
        if total <= 0.0 or not len(rows):
            return result
        wanted = np.asarray(rows, dtype=np.int64)
        starts, ends = self.doc_indptr[wanted], self.doc_indptr[wanted + 1]
        lengths = ends - starts
        positions = np.arange(int(lengths.sum()), dtype=np.int64)
        positions += np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        terms = self.doc_terms[positions]
        weights = np.where(np.isin(terms, term_ids), self.idf[terms], 0.0)
        owners = np.repeat(np.arange(len(rows)), lengths)
        result += np.bincount(owners, weights=weights, minlength=len(rows)).astype(np.float32)
        result /= total
        return result

    def document_frequency(self, word: str) -> int:
        """How many documents contain ``word`` (after tokenization; 0 for a stop word)."""
        terms = tokenize(word, stem=self.stem)
        if len(terms) != 1 or terms[0] not in self.vocabulary:
            return 0
        term_id = self.vocabulary[terms[0]]
        return int(self.indptr[term_id + 1] - self.indptr[term_id])

    def search(self, query: str) -> Scores:
        """BM25 score of every document for ``query``."""
        return self.scores(self.term_ids(query))
