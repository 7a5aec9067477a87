"""The OpenAI embedding provider: ``text-embedding-3-small`` by default, or any OpenAI-compatible
server through its base URL.

- **Batches within the API's limits**: at most ``batch_size`` inputs (the API takes 2,048) and
  about ``batch_chars`` characters (its limit is 300,000 tokens a request) per call.
- **One retry owner**: the SDK's own retries are off (``max_retries=0``); this adapter retries
  rate limits (429), server errors (5xx), timeouts and dropped connections with capped
  exponential backoff and jitter, honouring ``Retry-After``, up to ``max_attempts`` calls per
  batch. Anything else (a bad key, an unknown model, a rejected input) fails at once.
- **Answers are checked**: one vector per input, in input order (by ``index``), of the expected
  dimension, finite; anything else is an :class:`~capdisc.errors.EmbeddingError` naming the
  server and the field. Vendor errors never leave this module untranslated.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from capdisc.embedders.port import Matrix, check_vectors
from capdisc.errors import EmbeddingError

DEFAULT_MODEL = "text-embedding-3-small"
#: The API's cap on inputs per request.
API_MAX_INPUTS = 2048


@dataclass(frozen=True)
class OpenAIEmbedderSettings:
    """How to reach the provider; units in the names."""

    api_key: str
    model: str = DEFAULT_MODEL
    base_url: str | None = None
    #: The vector size expected back; sent as ``dimensions`` when ``request_dimensions``.
    dimensions: int = 1536
    #: Off for OpenAI-compatible servers that reject the ``dimensions`` parameter.
    request_dimensions: bool = True
    batch_size: int = 512
    batch_chars: int = 400_000
    timeout_s: float = 30.0
    max_attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 20.0


Sleep = Callable[[float], None]


class OpenAIEmbedder:
    """The :class:`~capdisc.embedders.port.Embedder` port over the OpenAI embeddings API."""

    def __init__(
        self,
        settings: OpenAIEmbedderSettings,
        *,
        client: Any = None,
        sleep: Sleep = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if not 1 <= settings.batch_size <= API_MAX_INPUTS:
            raise EmbeddingError(
                f"openai batch_size must be 1..{API_MAX_INPUTS}, got {settings.batch_size}"
            )
        self.settings = settings
        self._client = client if client is not None else _client(settings)
        self._sleep = sleep
        self._jitter = jitter
        self.requests = 0  # calls made to the server, retries included

    @property
    def id(self) -> str:
        return f"openai-{self.settings.model}-{self.settings.dimensions}"

    @property
    def dim(self) -> int:
        return self.settings.dimensions

    def embed(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = [
            self._embed_batch(batch)
            for batch in batches(texts, self.settings.batch_size, self.settings.batch_chars)
        ]
        return np.vstack(rows)

    def _embed_batch(self, texts: list[str]) -> Matrix:
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                self.requests += 1
                response = self._client.embeddings.create(**self._request(texts))
            except Exception as exc:  # the SDK's errors, translated below
                delay = self._retry_delay(exc, attempt)
                if delay is None:
                    raise _translated(exc, self._where()) from exc
                self._sleep(delay)
                continue
            return self._vectors(response, len(texts))
        raise AssertionError("unreachable: the last attempt either returns or raises")

    def _request(self, texts: list[str]) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.settings.model,
            "input": texts,
            "encoding_format": "float",
        }
        if self.settings.request_dimensions:
            request["dimensions"] = self.settings.dimensions
        return request

    def _retry_delay(self, exc: Exception, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when this error is final."""
        if attempt >= self.settings.max_attempts or not _retryable(exc):
            return None
        backoff = min(
            self.settings.backoff_max_s, self.settings.backoff_base_s * 2 ** (attempt - 1)
        )
        delay: float = backoff * (0.5 + 0.5 * float(self._jitter()))
        hinted = _retry_after_s(exc)
        return min(self.settings.backoff_max_s, max(delay, hinted)) if hinted else delay

    def _vectors(self, response: Any, expected: int) -> Matrix:
        data = getattr(response, "data", None)
        if not isinstance(data, list) or len(data) != expected:
            got = len(data) if isinstance(data, list) else type(data).__name__
            raise EmbeddingError(
                f"{self._where()} returned {got} embeddings in field 'data' for {expected} inputs"
            )
        try:
            ordered = sorted(data, key=lambda item: int(item.index))
            vectors = [item.embedding for item in ordered]
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            raise EmbeddingError(
                f"{self._where()} returned an item without a numeric 'index' "
                f"and an 'embedding' in field 'data': {exc}"
            ) from exc
        if [int(item.index) for item in ordered] != list(range(expected)):
            raise EmbeddingError(
                f"{self._where()} returned field 'data[].index' values that "
                f"are not 0..{expected - 1}"
            )
        matrix = check_vectors(vectors, expected, self.dim, f"{self._where()} field 'embedding'")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if not np.all(norms > 0):
            raise EmbeddingError(f"{self._where()} returned a zero vector in field 'embedding'")
        result: Matrix = (matrix / norms).astype(np.float32)
        return result

    def _where(self) -> str:
        return (
            f"the embedding server {self.settings.base_url or 'api.openai.com'} "
            f"(model {self.settings.model})"
        )


def batches(texts: Sequence[str], max_inputs: int, max_chars: int) -> list[list[str]]:
    """Consecutive batches of at most ``max_inputs`` texts and about ``max_chars`` characters
    (a single longer text gets a batch of its own)."""
    out: list[list[str]] = []
    current: list[str] = []
    size = 0
    for text in texts:
        if current and (len(current) >= max_inputs or size + len(text) > max_chars):
            out.append(current)
            current, size = [], 0
        current.append(text)
        size += len(text)
    if current:
        out.append(current)
    return out


def _client(settings: OpenAIEmbedderSettings) -> Any:
    try:
        import openai
    except ImportError as exc:
        raise EmbeddingError(
            "the OpenAI embedder needs the openai package: pip install "
            "'capdisc[openai]', or set CAPDISC_EMBEDDER=minilm"
        ) from exc
    if not settings.api_key:
        raise EmbeddingError(
            "the OpenAI embedder needs an API key: set CAPDISC_OPENAI_API_KEY "
            "(any value for a local OpenAI-compatible server)"
        )
    return openai.OpenAI(
        api_key=settings.api_key,
        base_url=settings.base_url,
        timeout=settings.timeout_s,
        max_retries=0,
    )


def _retryable(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status == 429 or status == 408 or status >= 500
    name = type(exc).__name__
    return name in ("APIConnectionError", "APITimeoutError")


def _retry_after_s(exc: Exception) -> float:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return 0.0
    try:
        value = float(headers.get("retry-after", 0) or 0)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def _translated(exc: Exception, where: str) -> EmbeddingError:
    status = getattr(exc, "status_code", None)
    detail = str(exc).strip() or type(exc).__name__
    if status == 401:
        return EmbeddingError(f"{where} refused the API key (401); check CAPDISC_OPENAI_API_KEY")
    if isinstance(status, int):
        return EmbeddingError(f"{where} answered HTTP {status}: {detail}")
    if _retryable(exc):
        return EmbeddingError(f"{where} could not be reached: {detail}")
    return EmbeddingError(
        f"{where} answered with a body that is not an embeddings response ({detail}); "
        "check that CAPDISC_OPENAI_BASE_URL points at an OpenAI-compatible API"
    )
