"""Embedders: the hashing embedder, the query cache, vector checks, and the bundled MiniLM."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from capdisc.embedders.factory import make_embedder
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.minilm import MINILM_DIM, MiniLMEmbedder
from capdisc.embedders.port import CachedQueryEmbedder, Matrix, check_vectors, embed_with_parts
from capdisc.errors import EmbeddingError
from capdisc.resources import embedder_for
from capdisc.settings import Settings


class CountingEmbedder:
    """A test double of the Embedder port: distinct vectors, and a record of every call."""

    id = "counting-4"
    dim = 4

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row, len(text) % self.dim] = 1.0
        return out


# -- HashingEmbedder -----------------------------------------------------------------------------


def test_hashing_vectors_are_identical_across_instances() -> None:
    texts = ["search the web", "create a github issue"]

    assert np.array_equal(HashingEmbedder().embed(texts), HashingEmbedder().embed(texts))


def test_hashing_vectors_are_unit_norm_float32() -> None:
    vectors = HashingEmbedder(64).embed(["search the web", "a", "Send an EMAIL to Bob!"])

    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0, 1.0], rtol=1e-6)


def test_hashing_texts_sharing_words_score_higher_than_unrelated_ones() -> None:
    query, related, unrelated = HashingEmbedder().embed(
        ["search the web for news", "web search for the latest news", "refund a stripe invoice"]
    )

    assert float(query @ related) > float(query @ unrelated)


def test_hashing_ignores_case_and_punctuation() -> None:
    upper, lower = HashingEmbedder().embed(["Web-Search!", "web search"])

    assert np.array_equal(upper, lower)


def test_hashing_of_no_texts_is_an_empty_matrix() -> None:
    assert HashingEmbedder(32).embed([]).shape == (0, 32)


@pytest.mark.parametrize(("dim", "embedder_id"), [(384, "hashing-384"), (64, "hashing-64")])
def test_hashing_id_names_its_dimension(dim: int, embedder_id: str) -> None:
    embedder = HashingEmbedder(dim)

    assert (embedder.id, embedder.dim) == (embedder_id, dim)


# -- make_embedder -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "dim"),
    [
        ("hashing", HashingEmbedder, 128),
        ("minilm", MiniLMEmbedder, MINILM_DIM),
    ],
)
def test_make_embedder_builds_the_named_embedder(name: str, kind: type, dim: int) -> None:
    embedder = make_embedder(name, hashing_dim=128)

    assert isinstance(embedder, kind)
    assert embedder.dim == dim


def test_make_embedder_refuses_an_unknown_name() -> None:
    with pytest.raises(EmbeddingError) as info:
        make_embedder("bert")

    assert str(info.value) == "unknown embedder 'bert'; use 'minilm' or 'hashing'"


# -- CachedQueryEmbedder -------------------------------------------------------------------------


def test_cache_returns_the_same_vector_and_calls_the_inner_embedder_once() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner)

    first = cache.embed_one("find flights")
    second = cache.embed_one("find flights")

    assert np.array_equal(first, second)
    assert inner.calls == [["find flights"]]


def test_cache_embeds_different_texts_separately() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner)

    cache.embed_one("a")
    cache.embed_one("bb")

    assert inner.calls == [["a"], ["bb"]]


def test_cache_evicts_the_least_recently_used_text() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=2)

    for text in ["a", "b", "a", "c", "a", "b"]:  # "c" evicts "b", the least recently used
        cache.embed_one(text)

    assert inner.calls == [["a"], ["b"], ["c"], ["b"]]


def _ticking() -> Callable[[], float]:
    """A clock that moves one second each time it is read (a model call reads it twice)."""
    return itertools.count().__next__  # type: ignore[return-value]


@pytest.mark.parametrize(
    "call",
    [
        lambda cache: cache.embed_one("find flights"),
        lambda cache: cache.embed_many(["find flights", "book hotels"]),
        lambda cache: cache.embed_with_parts("find flights and book hotels", ["book hotels"]),
        lambda cache: cache.embed_with_parts("find flights and book hotels", ["book"], False),
    ],
    ids=["one", "many", "pooled parts", "parts apart"],
)
def test_each_model_call_is_timed_and_a_cached_call_costs_no_model_time(
    call: Callable[[CachedQueryEmbedder], object],
) -> None:
    cache = CachedQueryEmbedder(CountingEmbedder(), clock=_ticking())

    call(cache)
    first = cache.take_model_ms()
    call(cache)

    assert first == 1000.0 and cache.take_model_ms() == 0.0


def test_the_model_time_is_taken_once() -> None:
    cache = CachedQueryEmbedder(CountingEmbedder(), clock=_ticking())
    cache.embed_one("a")

    assert cache.take_model_ms() == 1000.0 and cache.take_model_ms() == 0.0


def test_another_threads_model_calls_do_not_count_for_this_thread() -> None:
    cache = CachedQueryEmbedder(CountingEmbedder(), clock=_ticking())
    theirs: list[float] = []

    def other_turn() -> None:
        cache.embed_one("b")
        theirs.append(cache.take_model_ms())

    worker = threading.Thread(target=other_turn)
    worker.start()
    worker.join()

    assert theirs == [1000.0] and cache.take_model_ms() == 0.0


def test_cache_of_size_zero_always_calls_the_inner_embedder() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=0)

    cache.embed_one("a")
    cache.embed_one("a")

    assert inner.calls == [["a"], ["a"]]


# -- check_vectors -------------------------------------------------------------------------------


def test_check_vectors_returns_a_float32_matrix() -> None:
    checked = check_vectors([[1, 0], [0, 1]], 2, 2, "model")

    assert checked.dtype == np.float32
    assert checked.tolist() == [[1.0, 0.0], [0.0, 1.0]]


@pytest.mark.parametrize(
    ("vectors", "shape"),
    [
        pytest.param(np.zeros((3, 4)), "(3, 4)", id="too-many-rows"),
        pytest.param(np.zeros((2, 5)), "(2, 5)", id="wrong-dim"),
        pytest.param(np.zeros(8), "(8,)", id="flat"),
        pytest.param(np.zeros((2, 4, 1)), "(2, 4, 1)", id="three-dimensional"),
        pytest.param([], "(0,)", id="empty"),
    ],
)
def test_check_vectors_rejects_the_wrong_shape(vectors: Any, shape: str) -> None:
    with pytest.raises(EmbeddingError) as info:
        check_vectors(vectors, 2, 4, "model")

    assert str(info.value) == f"model returned shape {shape}, expected (2, 4)"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_vectors_rejects_non_finite_values(bad: float) -> None:
    vectors = np.ones((2, 4))
    vectors[1, 2] = bad

    with pytest.raises(EmbeddingError) as info:
        check_vectors(vectors, 2, 4, "model")

    assert str(info.value) == "model returned non-finite values"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(10**400, id="too-large-for-a-float"),
        pytest.param("x", id="text"),
        pytest.param({"a": 1}, id="object"),
        pytest.param([1.0], id="nested"),
    ],
)
def test_check_vectors_rejects_what_is_not_a_number_naming_the_source(bad: Any) -> None:
    vectors: list[list[Any]] = [[1.0, 0.0], [bad, 1.0]]

    with pytest.raises(EmbeddingError, match=r"^model returned"):
        check_vectors(vectors, 2, 2, "model")


# -- MiniLMEmbedder ------------------------------------------------------------------------------


@pytest.mark.model
def test_minilm_loads_offline_and_embeds_paraphrases_closer_than_unrelated_text() -> None:
    vectors = MiniLMEmbedder().embed(
        [
            "search the web for today's news",
            "look up current events online",
            "bake a chocolate cake",
        ]
    )

    assert vectors.shape == (3, MINILM_DIM)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0, 1.0], rtol=1e-5)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


@pytest.mark.model
def test_minilm_many_texts_on_parallel_streams_embed_as_one_stream_does() -> None:
    texts = [
        f"tool {i}: " + "fetch the weather forecast for a city " * (i % 7 + 1) for i in range(40)
    ]

    parallel = MiniLMEmbedder(streams=2).embed(texts)  # 5 batches: run on two threads
    serial = MiniLMEmbedder(streams=1).embed(texts)

    np.testing.assert_allclose(parallel, serial, atol=1e-5)


# -- query and sub-queries in one pass -------------------------------------------------------------


def test_embed_with_parts_falls_back_to_separate_texts_without_span_pooling() -> None:
    embedder = HashingEmbedder(64)
    text = "Book a flight to Rome. Then rent a car at the airport."
    parts = ["Book a flight to Rome.", "rent a car at the airport."]

    rows = embed_with_parts(embedder, text, parts)

    np.testing.assert_array_equal(rows, embedder.embed([text, *parts]))


def test_cached_parts_cost_one_inner_call_per_turn() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner)
    text, parts = "alpha beta. gamma delta.", ["alpha beta.", "gamma delta."]

    first = cache.embed_with_parts(text, parts)
    second = cache.embed_with_parts(text, parts)

    assert inner.calls == [[text, *parts]]
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert np.array_equal(cache.embed_one(text), first[0])  # the whole query is cached too
    assert len(inner.calls) == 1


@pytest.mark.model
def test_minilm_span_rows_are_unit_vectors_near_the_part_embedded_alone() -> None:
    embedder = MiniLMEmbedder()
    text = "Find the weather forecast for Paris. Then book a table at an Italian restaurant."
    parts = ["Find the weather forecast for Paris.", "book a table at an Italian restaurant."]

    rows = embed_with_parts(embedder, text, parts)
    alone = embedder.embed([text, *parts])

    assert rows.shape == (3, MINILM_DIM)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    assert float(rows[0] @ alone[0]) > 0.999  # row 0 is the plain embedding of the text
    assert float(rows[1] @ alone[1]) > float(rows[1] @ alone[2])
    assert float(rows[2] @ alone[2]) > float(rows[2] @ alone[1])


@pytest.mark.model
def test_minilm_part_missing_from_the_text_is_embedded_alone() -> None:
    embedder = MiniLMEmbedder()

    rows = embed_with_parts(embedder, "short text", ["short", "not in the text"])

    np.testing.assert_allclose(rows[2], embedder.embed(["not in the text"])[0], atol=1e-5)


class DictVectors:
    """In-memory SharedVectors."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value


@pytest.mark.parametrize("pooled", [True, False])
def test_a_turn_embedded_by_one_worker_costs_another_no_model_call(pooled: bool) -> None:
    shared = DictVectors()
    first, second = CountingEmbedder(), CountingEmbedder()
    text, parts = "a b. c d.", ["a b.", "c d."]

    one = CachedQueryEmbedder(first, shared=shared).embed_with_parts(text, parts, pooled)
    two = CachedQueryEmbedder(second, shared=shared).embed_with_parts(text, parts, pooled)

    assert first.calls and second.calls == []
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


def test_parts_embedded_on_their_own_are_cached_apart_from_pooled_ones() -> None:
    shared, inner = DictVectors(), CountingEmbedder()
    cache = CachedQueryEmbedder(inner, shared=shared)
    text, parts = "a b. c d.", ["a b.", "c d."]

    cache.embed_with_parts(text, parts, pooled=True)
    cache.embed_with_parts(text, parts, pooled=False)

    assert inner.calls[-2:] == [[text], parts]  # the parts alone, after the pooled pass
    assert len(shared.values) == 2


def test_a_shared_value_of_the_wrong_size_is_embedded_again() -> None:
    shared, inner = DictVectors(), CountingEmbedder()
    CachedQueryEmbedder(CountingEmbedder(), shared=shared).embed_with_parts("q", [])
    shared.values = {key: b"\x00" * 3 for key in shared.values}

    vector, _parts = CachedQueryEmbedder(inner, shared=shared).embed_with_parts("q", [])

    assert inner.calls == [["q"]] and vector.shape == (4,)


@pytest.mark.parametrize("streams", [1, 3])
def test_the_model_streams_setting_reaches_the_embedder(streams: int) -> None:
    embedder = embedder_for(Settings(embedder="minilm", model_streams=streams))

    assert isinstance(embedder, MiniLMEmbedder) and embedder._streams == streams


@pytest.mark.model
@pytest.mark.parametrize(("spin", "entry"), [(False, "0"), (True, "1")])
def test_the_model_spin_setting_reaches_the_onnxruntime_session(spin: bool, entry: str) -> None:
    embedder = embedder_for(Settings(embedder="minilm", model_spin=spin))
    assert isinstance(embedder, MiniLMEmbedder)

    session, _tokenizer = embedder._load()

    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
