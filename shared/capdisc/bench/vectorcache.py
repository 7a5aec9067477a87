"""Embeddings kept on disk per text, for benchmark runs: one SQLite file per embedder, keyed by
the SHA-256 of each text, so changing one tool of a 10,000-tool catalog embeds one text again,
not the catalog. A vector of the wrong size (another model under the same id) is ignored and
replaced."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from capdisc.embedders.port import Embedder, Matrix

#: Texts looked up per SQL statement (SQLite's bound-parameter limit is 32,766).
LOOKUP_CHUNK = 900


class TextVectorCache:
    """Vectors of one embedder by text, in ``{directory}/{embedder id}.sqlite``."""

    def __init__(self, directory: Path, embedder: Embedder) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder
        self.path = directory / f"{embedder.id}.sqlite"
        self._db = sqlite3.connect(self.path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS vectors (digest TEXT PRIMARY KEY, vector BLOB NOT NULL)"
        )

    def get(self, texts: Sequence[str]) -> dict[str, Matrix]:
        """The cached vectors of ``texts`` (by text); missing ones are absent."""
        digests = {_digest(t): t for t in texts}
        found: dict[str, Matrix] = {}
        keys = list(digests)
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT digest, vector FROM vectors WHERE digest IN ({marks})", chunk
            )
            for digest, blob in rows:
                vector = np.frombuffer(blob, dtype=np.float32)
                if vector.shape == (self.embedder.dim,):
                    found[digests[digest]] = vector
        return found

    def put(self, texts: Sequence[str], vectors: Matrix) -> None:
        rows = [
            (_digest(t), np.asarray(v, dtype=np.float32).tobytes())
            for t, v in zip(texts, vectors, strict=True)
        ]
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", rows)

    def close(self) -> None:
        self._db.close()


def embed_through(
    cache: TextVectorCache | None, embedder: Embedder, texts: Sequence[str], batch: int = 32
) -> Matrix:
    """Vectors of ``texts``: cached ones read, the rest embedded in length-sorted batches (so
    little is spent on padding) and cached."""
    known = cache.get(texts) if cache is not None else {}
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    missing.sort(key=len)
    for start in range(0, len(missing), batch):
        chunk = missing[start : start + batch]
        vectors = embedder.embed(chunk)
        known.update(zip(chunk, vectors, strict=True))
        if cache is not None:
            cache.put(chunk, vectors)
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    for row, text in enumerate(texts):
        out[row] = known[text]
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
