"""The deterministic hashing embedder: fast and dependency-free, for tests and development."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np

from capdisc.embedders.minilm import MINILM_DIM
from capdisc.embedders.port import Matrix, normalize_rows

_WORD = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Deterministic bag of hashed words and word bigrams: no model, same vectors everywhere.

    Good enough that texts sharing words are near each other, which is what tests need.
    """

    def __init__(self, dim: int = MINILM_DIM) -> None:
        self._dim = dim

    @property
    def id(self) -> str:
        return f"hashing-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for feature in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                index = int.from_bytes(digest[:4], "little") % self._dim
                sign = 1.0 if digest[4] & 1 else -1.0
                out[row, index] += sign
            if not words:  # no word characters at all: hash the raw text so it is not zero
                digest = hashlib.blake2b(text.encode(), digest_size=4).digest()
                out[row, int.from_bytes(digest, "little") % self._dim] = 1.0
        return normalize_rows(out)
