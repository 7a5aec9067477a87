"""The embedder port: vectors, the :class:`Embedder` protocol, a query-vector cache and checks.

An :class:`Embedder` turns texts into L2-normalized float32 vectors. ``id`` names the vector
space: vectors from different ids are never compared (Redis keys carry it).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from capdisc.errors import EmbeddingError

Vector = npt.NDArray[np.float32]
Matrix = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Port: texts in, one L2-normalized float32 row per text out."""

    @property
    def id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Matrix: ...


class SharedVectors(Protocol):
    """Port: a cache of query vectors shared by every discovery worker (Redis in production),
    so a query one worker embedded costs the others a lookup, not a model call."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...


class CachedQueryEmbedder:
    """An LRU cache of query embeddings in front of an embedder (per-turn queries), backed by
    an optional :class:`SharedVectors` cache for the vectors of whole turns.

    It also counts, per thread, the time its calls spend in the model (``clock`` in seconds):
    :meth:`take_model_ms` gives what a turn spent there, so a reply can say how much of it was
    the model and how much the search (a cached turn spends none)."""

    def __init__(
        self,
        inner: Embedder,
        size: int = 4096,
        shared: SharedVectors | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inner = inner
        self._size = size
        self._cache: OrderedDict[str, Vector] = OrderedDict()
        self._lock = threading.Lock()
        self._shared = shared
        self._clock = clock
        self._spent = threading.local()

    def take_model_ms(self) -> float:
        """Milliseconds this thread's calls spent in the model since it last asked (the
        count starts again from zero)."""
        spent: float = getattr(self._spent, "ms", 0.0)
        self._spent.ms = 0.0
        return spent

    def _in_model(self, call: Callable[[], Matrix]) -> Matrix:
        """``call()`` (a call of the model), its time added to this thread's count."""
        started = self._clock()
        try:
            return call()
        finally:
            spent = (self._clock() - started) * 1000
            self._spent.ms = getattr(self._spent, "ms", 0.0) + spent

    def embed_one(self, text: str) -> Vector:
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                return hit
        vector: Vector = self._in_model(lambda: self.inner.embed([text]))[0]
        with self._lock:
            self._cache[text] = vector
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return vector

    def embed_with_parts(
        self, text: str, parts: Sequence[str], pooled: bool = True
    ) -> tuple[Vector, Matrix]:
        """``text``'s vector and its ``parts``' vectors: pooled from ``text``'s own pass
        (:func:`embed_with_parts`) or, without ``pooled``, each embedded on its own. Cached
        under ``text`` together (here and in the shared cache), so a repeated turn costs no
        model call on any worker."""
        pooled = pooled or not parts
        key = ("\x00parts\x00" if pooled else "\x00apart\x00") + text + "\x00" + "\x00".join(parts)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            hit = self._shared_or_embedded(text, parts, pooled)
            with self._lock:
                self._cache[key] = hit
                self._cache[text] = hit[0]
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return hit[0], hit[1:]

    def _shared_or_embedded(self, text: str, parts: Sequence[str], pooled: bool) -> Matrix:
        if self._shared is None:
            return self._embedded(text, parts, pooled)
        mode = [] if pooled else ["\x00apart"]
        key = hashlib.sha256("\x00".join([self.inner.id, *mode, text, *parts]).encode()).hexdigest()
        raw = self._shared.get(key)
        rows = len(parts) + 1
        if raw is not None and len(raw) == rows * self.inner.dim * 4:
            shared: Matrix = np.frombuffer(raw, dtype=np.float32).reshape(rows, self.inner.dim)
            return shared
        matrix = self._embedded(text, parts, pooled)
        self._shared.put(key, np.ascontiguousarray(matrix, dtype=np.float32).tobytes())
        return matrix

    def _embedded(self, text: str, parts: Sequence[str], pooled: bool) -> Matrix:
        if pooled:
            return self._in_model(lambda: embed_with_parts(self.inner, text, parts))
        # two calls: the parts padded to the longest part, not to the whole text
        return self._in_model(
            lambda: np.vstack([self.inner.embed([text]), self.inner.embed(list(parts))])
        )

    def embed_many(self, texts: Sequence[str]) -> Matrix:
        """One row per text; the cache misses are embedded in one batch."""
        if not texts:
            return np.zeros((0, self.inner.dim), dtype=np.float32)
        with self._lock:
            hits = {t: self._cache[t] for t in texts if t in self._cache}
        missing = list(dict.fromkeys(t for t in texts if t not in hits))
        if missing:
            fresh = self._in_model(lambda: self.inner.embed(missing))
            with self._lock:
                for text, vector in zip(missing, fresh, strict=True):
                    hits[text] = vector
                    self._cache[text] = vector
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return np.stack([hits[t] for t in texts]).astype(np.float32)


def embed_with_parts(embedder: Embedder, text: str, parts: Sequence[str]) -> Matrix:
    """Row 0 embeds ``text``, row ``i`` its substring ``parts[i - 1]``: in one model pass when
    the embedder can pool spans (:meth:`MiniLMEmbedder.embed_spans`), else as separate texts."""
    spans_of = getattr(embedder, "embed_spans", None)
    found = [(i, text.find(part)) for i, part in enumerate(parts)]
    found = [(i, start) for i, start in found if start >= 0]
    if spans_of is None or not found:
        return embedder.embed([text, *parts])
    pooled: Matrix = spans_of(text, [(start, start + len(parts[i])) for i, start in found])
    out = np.zeros((len(parts) + 1, pooled.shape[1]), dtype=np.float32)
    out[0] = pooled[0]
    out[[i + 1 for i, _ in found]] = pooled[1:]
    rest = [i for i in range(len(parts)) if i not in {j for j, _ in found}]
    if rest:  # a part that is not a substring of the text: embedded on its own
        out[[i + 1 for i in rest]] = embedder.embed([parts[i] for i in rest])
    return out


def check_vectors(vectors: Any, expected_rows: int, dim: int, source: str) -> Matrix:
    """Validate an embedder's answer: shape, dtype and finiteness, naming ``source``."""
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EmbeddingError(
            f"{source} returned something that is not a matrix of numbers: {exc}"
        ) from exc
    if array.shape != (expected_rows, dim):
        raise EmbeddingError(
            f"{source} returned shape {array.shape}, expected ({expected_rows}, {dim})"
        )
    if not np.isfinite(array).all():
        raise EmbeddingError(f"{source} returned non-finite values")
    return array


def normalize_rows(matrix: Matrix) -> Matrix:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    result: Matrix = (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)
    return result
