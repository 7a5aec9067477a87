"""Plain fusion: the yardstick every retrieval change is measured against.

70% min-max-normalized dense cosine plus 30% min-max-normalized BM25, both over one text per
tool, ``name words: description | parameter names``, with the same embedder as the engine and
nothing else (no decomposition, no exact-name path, no abstention). It is what a careful team
would build in an afternoon; the engine's extra machinery has to beat it on every catalog to
count as a gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capdisc.bench.evaluation import embed_cached
from capdisc.embedders.port import Embedder, Matrix, Vector
from capdisc.identifiers import split_identifiers
from capdisc.models import Capability
from capdisc.retrieval.lexical import LexicalIndex, Scores
from capdisc.retrieval.scoring import minmax

#: Weight of the dense side; BM25 gets the rest.
DENSE_WEIGHT = 0.7


def plain_text(capability: Capability) -> str:
    """``name words: description | parameter names``."""
    params = " ".join(capability.parameter_names)
    text = f"{split_identifiers(capability.name)}: {capability.description.strip()}"
    return f"{text} | {params}" if params else text


@dataclass(frozen=True)
class PlainRanking:
    ids: tuple[str, ...]
    abstained: bool = False


@dataclass(frozen=True, eq=False)
class PlainFusion:
    """The baseline index: one embedded text per tool and BM25 over the same text."""

    ids: tuple[str, ...]
    matrix: Matrix
    lexicon: LexicalIndex

    @classmethod
    def build(
        cls,
        capabilities: Sequence[Capability],
        embedder: Embedder,
        cache_dir: Path | None = None,
    ) -> PlainFusion:
        texts = [plain_text(c) for c in capabilities]
        matrix = np.asarray(embed_cached(embedder, texts, cache_dir), dtype=np.float32)
        return cls(tuple(c.id for c in capabilities), matrix, LexicalIndex.build(texts))

    def search(self, query: str, vector: Vector, k: int) -> PlainRanking:
        """The ``k`` best tools for ``query`` (``vector`` embeds it)."""
        cosine: Scores = self.matrix @ np.asarray(vector, dtype=np.float32)
        bm25 = self.lexicon.scores(self.lexicon.term_ids(query))
        fused = DENSE_WEIGHT * minmax(cosine) + (1.0 - DENSE_WEIGHT) * minmax(bm25)
        top = np.argsort(-fused, kind="stable")[:k]
        return PlainRanking(tuple(self.ids[i] for i in top))
