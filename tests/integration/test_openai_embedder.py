"""The OpenAI embedding provider against an OpenAI-compatible server on loopback.

The server is real HTTP on 127.0.0.1 (the official SDK talks to it through its own transport);
it records every request and answers from a script: embeddings, rate limits, server errors,
malformed bodies. Backoff sleeps are recorded instead of slept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from capdisc.embedders.openai import OpenAIEmbedder, OpenAIEmbedderSettings, batches
from capdisc.errors import EmbeddingError
from capdisc.resources import embedder_for
from capdisc.settings import Settings

DIM = 8
Reply = tuple[int, dict[str, Any], dict[str, str]]


def vector_for(text: str) -> list[float]:
    rng = np.random.default_rng(abs(hash(text)) % 2**32)
    return [float(x) for x in rng.normal(size=DIM)]


def embeddings_body(request: dict[str, Any]) -> dict[str, Any]:
    inputs = request["input"]
    data = [
        {"object": "embedding", "index": i, "embedding": vector_for(text)}
        for i, text in enumerate(inputs)
    ]
    data.reverse()  # servers may answer out of order: the index field decides
    return {
        "object": "list",
        "data": data,
        "model": request["model"],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }


class Server:
    """Answers POST /v1/embeddings; ``script`` holds replies for the next requests (status,
    body, raw text sent as it is, or None for a normal answer, headers); afterwards it answers
    normally."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.script: list[tuple[int, dict[str, Any] | str | None, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, reply, headers = outer.script.pop(0) if outer.script else (200, None, {})
                answer = reply if reply is not None else embeddings_body(body)
                payload = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def indexing_env(server: Server, max_attempts: int, retry_base_s: float) -> dict[str, str]:
    """An indexing worker's environment that embeds with ``server`` (one HTTP attempt a call)
    and retries a task ``max_attempts`` times, ``retry_base_s`` apart at first."""
    return {
        "CAPDISC_EMBEDDER": "openai",
        "CAPDISC_OPENAI_BASE_URL": server.url,
        "CAPDISC_OPENAI_API_KEY": "sk-test",
        "CAPDISC_OPENAI_DIMENSIONS": str(DIM),
        "CAPDISC_OPENAI_MAX_ATTEMPTS": "1",
        "CAPDISC_INDEXING_MAX_ATTEMPTS": str(max_attempts),
        "CAPDISC_INDEXING_RETRY_BASE_S": str(retry_base_s),
    }


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


def embedder(server: Server, sleeps: list[float] | None = None, **changes: Any) -> OpenAIEmbedder:
    settings = OpenAIEmbedderSettings(
        api_key="sk-test", base_url=server.url, dimensions=DIM, timeout_s=5.0, **changes
    )
    record = sleeps if sleeps is not None else []
    return OpenAIEmbedder(settings, sleep=record.append, jitter=lambda: 1.0)


ERROR = {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}


def test_vectors_come_back_in_input_order_normalized(server: Server) -> None:
    vectors = embedder(server).embed(["alpha", "beta", "gamma"])

    expected = np.array([vector_for(t) for t in ["alpha", "beta", "gamma"]])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, rtol=1e-6)
    assert vectors.dtype == np.float32


def test_the_request_names_model_dimensions_float_encoding_and_the_key(server: Server) -> None:
    embedder(server).embed(["alpha"])

    assert server.requests == [
        {
            "model": "text-embedding-3-small",
            "input": ["alpha"],
            "encoding_format": "float",
            "dimensions": DIM,
        }
    ]
    assert server.headers[0]["authorization"] == "Bearer sk-test"


def test_servers_that_reject_dimensions_are_not_sent_it(server: Server) -> None:
    embedder(server, request_dimensions=False).embed(["alpha"])

    assert "dimensions" not in server.requests[0]


def test_inputs_are_batched_within_the_limits(server: Server) -> None:
    vectors = embedder(server, batch_size=3).embed([f"text {i}" for i in range(7)])

    assert [len(r["input"]) for r in server.requests] == [3, 3, 1]
    assert vectors.shape == (7, DIM)


@pytest.mark.parametrize(
    ("texts", "max_inputs", "max_chars", "expected"),
    [
        ([], 3, 100, []),
        (["a", "b", "c", "d"], 2, 100, [["a", "b"], ["c", "d"]]),
        (["aaaa", "bbbb", "cc"], 10, 8, [["aaaa", "bbbb"], ["cc"]]),
        (["x" * 50, "y"], 10, 8, [["x" * 50], ["y"]]),
    ],
)
def test_batches_respect_inputs_and_characters(
    texts: list[str], max_inputs: int, max_chars: int, expected: list[list[str]]
) -> None:
    assert batches(texts, max_inputs, max_chars) == expected


def test_a_rate_limit_is_retried_after_the_servers_retry_after(server: Server) -> None:
    server.script = [(429, ERROR, {"Retry-After": "2"})]
    sleeps: list[float] = []

    vectors = embedder(server, sleeps).embed(["alpha"])

    assert vectors.shape == (1, DIM)
    assert len(server.requests) == 2 and sleeps == [2.0]


def test_server_errors_back_off_exponentially_then_succeed(server: Server) -> None:
    server.script = [(500, ERROR, {}), (503, ERROR, {})]
    sleeps: list[float] = []

    embedder(server, sleeps, backoff_base_s=0.5).embed(["alpha"])

    assert sleeps == [0.5, 1.0]
    assert len(server.requests) == 3


def test_retries_stop_at_max_attempts_with_one_retry_owner(server: Server) -> None:
    server.script = [(500, ERROR, {})] * 10

    with pytest.raises(EmbeddingError) as info:
        embedder(server, max_attempts=3).embed(["alpha"])

    assert len(server.requests) == 3  # the SDK's own retries are off: no 3 x 3
    assert "answered HTTP 500" in str(info.value) and server.url in str(info.value)


def test_a_bad_key_fails_at_once_naming_the_setting(server: Server) -> None:
    server.script = [(401, {"error": {"message": "bad key", "type": "invalid_request_error"}}, {})]

    with pytest.raises(EmbeddingError, match="CAPDISC_OPENAI_API_KEY"):
        embedder(server).embed(["alpha"])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"object": "list", "data": [], "model": "m", "usage": {}}, "0 embeddings in field 'data'"),
        (
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [1.0, 2.0]}],
                "model": "m",
                "usage": {},
            },
            "field 'embedding' returned shape (1, 2)",
        ),
        (
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 5, "embedding": [1.0] * DIM}],
                "model": "m",
                "usage": {},
            },
            "field 'data[].index'",
        ),
        (
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.0] * DIM}],
                "model": "m",
                "usage": {},
            },
            "zero vector in field 'embedding'",
        ),
    ],
)
def test_a_broken_response_is_an_error_naming_the_field(
    server: Server, body: dict[str, Any], message: str
) -> None:
    server.script = [(200, body, {})]

    with pytest.raises(EmbeddingError) as info:
        embedder(server).embed(["alpha"])

    assert message in str(info.value)
    assert len(server.requests) == 1  # a malformed answer is not retried


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '{"object": "list", "data": [{"object": "embedding", "index": Infinity, '
            f'"embedding": {[1.0] * DIM}}}]}}',
            "without a numeric 'index'",
        ),
        (
            '{"object": "list", "data": [{"object": "embedding", "index": 0, '
            f'"embedding": [1{"0" * 400}{", 1.0" * (DIM - 1)}]}}]}}',
            "not an embeddings response",
        ),
        ("this is not JSON", "not an embeddings response"),
    ],
)
def test_an_unreadable_answer_is_an_embedding_error_not_a_crash(
    server: Server, body: str, message: str
) -> None:
    server.script = [(200, body, {})]

    with pytest.raises(EmbeddingError) as info:
        embedder(server).embed(["alpha"])

    assert message in str(info.value)
    assert "could not be reached" not in str(info.value)  # it answered
    assert len(server.requests) == 1


def test_an_unreachable_server_is_an_error_after_the_attempts() -> None:
    settings = OpenAIEmbedderSettings(
        api_key="sk",
        base_url="http://127.0.0.1:9/v1",
        dimensions=DIM,
        timeout_s=1.0,
        max_attempts=2,
    )
    sleeps: list[float] = []

    with pytest.raises(EmbeddingError, match="could not be reached"):
        OpenAIEmbedder(settings, sleep=sleeps.append, jitter=lambda: 0.0).embed(["alpha"])
    assert len(sleeps) == 1


def test_settings_build_the_provider_and_name_its_vector_space(server: Server) -> None:
    settings = Settings.load(
        environ={
            "CAPDISC_EMBEDDER": "openai",
            "CAPDISC_OPENAI_BASE_URL": server.url,
            "CAPDISC_OPENAI_API_KEY": "sk-test",
            "CAPDISC_OPENAI_DIMENSIONS": str(DIM),
        }
    )

    provider = embedder_for(settings)

    assert (provider.id, provider.dim) == (f"openai-text-embedding-3-small-{DIM}", DIM)
    assert provider.embed(["alpha"]).shape == (1, DIM)


def test_a_missing_key_is_a_clear_error() -> None:
    with pytest.raises(EmbeddingError, match="CAPDISC_OPENAI_API_KEY"):
        embedder_for(Settings.load(environ={"CAPDISC_EMBEDDER": "openai"}))


def test_the_api_key_never_shows_in_the_settings_repr() -> None:
    settings = Settings.load(environ={"CAPDISC_OPENAI_API_KEY": "sk-secret"})

    assert "sk-secret" not in repr(settings)
