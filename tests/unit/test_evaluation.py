"""Benchmark catalogs as capabilities, the retrieval metrics, and the benchmark runner."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from capdisc.bench.evaluation import (
    BenchmarkRun,
    LabelledQuery,
    abstention_metrics,
    answer_floor,
    build_snapshot,
    calibrated,
    embed_cached,
    fit_logistic,
    load_queries,
    ndcg_at,
    percentile,
    ranking_metrics,
    recall_at,
    reciprocal_rank,
    run_retrieval_benchmark,
    sample_queries,
)
from capdisc.discovery.config import DiscoveryConfig
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import Matrix
from capdisc.errors import ManifestError
from capdisc.models import Capability
from capdisc.registry.catalogs import (
    capability_from_benchmark_tool,
    load_catalog,
    read_jsonl_catalog,
)
from capdisc.registry.normalize import capability_from_record
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.relevance import relevance
from capdisc.retrieval.results import RankedCapability, RetrievalResult
from capdisc.retrieval.text import full_text, summary_text

FIGURE_KEYS = {
    "recall@1",
    "recall@3",
    "recall@5",
    "recall@10",
    "ndcg@5",
    "complete@5",
    "hit@5",
    "mrr",
    "queries",
    "tools",
    "latency_ms",
    "latency_with_embedding_ms",
    "abstained_answerable",
    "abstain",
}


# -- metrics on hand-computed examples ------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranked", "relevant", "k", "expected"),
    [
        (["a", "b", "c"], {"a"}, 1, 1.0),
        (["a", "b", "c"], {"c"}, 1, 0.0),
        (["a", "b", "c"], {"b", "c", "d"}, 3, 2 / 3),
        (["a", "b"], {"a", "b"}, 10, 1.0),
    ],
)
def test_recall_at(ranked: list[str], relevant: set[str], k: int, expected: float) -> None:
    assert recall_at(ranked, relevant, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("ranked", "relevant", "expected"),
    [
        (["a", "x", "x", "x", "x"], {"a"}, 1.0),
        (["x", "a", "x", "x", "x"], {"a"}, 1 / np.log2(3)),
        (
            ["x", "a", "x", "b", "x"],
            {"a", "b"},
            (1 / np.log2(3) + 1 / np.log2(5)) / (1 + 1 / np.log2(3)),
        ),
        (["x", "x", "x", "x", "x", "a"], {"a"}, 0.0),
    ],
)
def test_ndcg_at_5(ranked: list[str], relevant: set[str], expected: float) -> None:
    assert ndcg_at(ranked, relevant) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("ranked", "relevant", "expected"),
    [(["a", "b"], {"a"}, 1.0), (["x", "y", "a"], {"a", "b"}, 1 / 3), (["x"], {"a"}, 0.0)],
)
def test_reciprocal_rank(ranked: list[str], relevant: set[str], expected: float) -> None:
    assert reciprocal_rank(ranked, relevant) == pytest.approx(expected)


def test_ranking_metrics_average_answerable_queries_only() -> None:
    rankings = [["a", "b", "c", "d", "e", "f"], ["x", "b", "y", "z", "w", "c"], ["q"]]
    relevant: list[Sequence[str]] = [("a", "c"), ("b", "c"), ()]
    figures = ranking_metrics(rankings, relevant)
    assert figures["recall@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert figures["recall@5"] == pytest.approx((1.0 + 0.5) / 2)
    assert figures["recall@10"] == pytest.approx(1.0)
    assert figures["complete@5"] == pytest.approx(0.5)
    assert figures["hit@5"] == pytest.approx(1.0)
    assert figures["mrr"] == pytest.approx((1.0 + 0.5) / 2)


@pytest.mark.parametrize(
    ("abstained", "relevant", "expected"),
    [
        (
            [True, False, False, True],
            [(), (), ("a",), ("a",)],
            {"abstain_accuracy": 0.5, "answer_rate": 0.5},
        ),
        ([False, False], [("a",), ("b",)], {}),
    ],
)
def test_abstention_metrics(
    abstained: list[bool], relevant: list[Sequence[str]], expected: dict[str, float]
) -> None:
    assert abstention_metrics(abstained, relevant) == pytest.approx(expected)


@pytest.mark.parametrize(("q", "expected"), [(50, 3.0), (99, 5.0), (0, 1.0)])
def test_percentile_nearest_rank(q: float, expected: float) -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], q) == expected


# -- loading benchmark catalogs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "cap_id", "name", "display"),
    [
        (
            {"id": "getWeather", "name": "getWeather", "description": "Weather."},
            "tool:getWeather",
            "getWeather",
            "Get Weather",
        ),
        (
            {"id": "PDF&URLTool", "name": "PDF&URLTool", "description": "Reads PDFs."},
            "tool:PDF_URLTool",
            "PDF_URLTool",
            "PDF URL Tool",
        ),
        (
            {
                "id": "timeport",
                "name": "timeport",
                "name_for_human": "Timeport",
                "description": "A game.",
            },
            "tool:timeport",
            "timeport",
            "Timeport",
        ),
        (
            {"id": "x" * 300, "name": "x" * 300, "description": "Long."},
            "tool:" + "x" * 150,
            "x" * 64,
            "X" + "x" * 63,
        ),
    ],
)
def test_benchmark_tools_become_valid_capabilities(
    record: dict[str, object], cap_id: str, name: str, display: str
) -> None:
    capability = capability_from_benchmark_tool(record)
    assert (capability.id, capability.name, capability.display_name) == (cap_id, name, display)
    assert (
        capability_from_record(
            {k: v for k, v in capability.to_dict().items() if k != "full_content"}, "t"
        )
        == capability
    )


def test_plugin_description_for_model_is_a_second_paragraph() -> None:
    capability = capability_from_benchmark_tool(
        {
            "id": "t",
            "name": "t",
            "description": "Short.",
            "description_for_model": "Longer text.",
            "category": "Chemical Engineering/Forensic engineering",
            "parameters": {
                "type": "object",
                "properties": {"sample_id": {"type": "string", "description": "Which"}},
            },
        }
    )
    assert capability.description == "Short.\n\nLonger text."
    assert capability.category == "chemical-engineering_forensic-engineering"
    assert summary_text(capability) == "T: Short."
    assert "Parameters: sample id (Which)" in full_text(capability)


def test_colliding_ids_get_a_suffix() -> None:
    taken: set[str] = set()
    first = capability_from_benchmark_tool({"id": "a b", "description": "x"}, taken)
    second = capability_from_benchmark_tool({"id": "a&b", "description": "x"}, taken)
    assert (first.id, second.id) == ("tool:a_b", "tool:a_b-2")


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, Path]:
    tools = _write(
        tmp_path / "tools.jsonl",
        [
            {
                "id": "getWeather",
                "name": "getWeather",
                "description": "Weather forecast for a city",
                "parameters": None,
                "category": "info",
            },
            {
                "id": "sendEmail",
                "name": "sendEmail",
                "description": "Send an email message",
                "parameters": None,
                "category": "mail",
            },
            {
                "id": "convertCurrency",
                "name": "convertCurrency",
                "description": "Convert money between currencies",
                "parameters": None,
                "category": "finance",
            },
        ],
    )
    queries = _write(
        tmp_path / "queries.jsonl",
        [
            {
                "id": "q1",
                "query": "what is the weather forecast in Oslo",
                "relevant": ["getWeather"],
            },
            {"id": "q2", "query": "send an email message to Ann", "relevant": ["sendEmail"]},
            {"id": "q3", "query": "convert money to yen", "relevant": ["convertCurrency", "gone"]},
            {"id": "q4", "query": "unknown labels only", "relevant": ["gone"]},
        ],
    )
    return tools, queries


def test_queries_map_labels_and_drop_unknown_ones(dataset: tuple[Path, Path]) -> None:
    catalog = load_catalog(dataset[0])
    queries = load_queries(dataset[1], catalog)
    assert [q.id for q in queries] == ["q1", "q2", "q3"]
    assert queries[2].relevant == ("tool:convertCurrency",)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "queries.jsonl:2: is not JSON"),
        ('["a list"]', "queries.jsonl:2: must be a JSON object"),
        ('{"id": "q", "relevant": ["getWeather"]}', "queries.jsonl:2: field 'query': must be"),
        ('{"query": "  ", "relevant": []}', "queries.jsonl:2: field 'query': must be"),
        ('{"query": "hi", "relevant": "getWeather"}', "queries.jsonl:2: field 'relevant'"),
        ('{"query": "hi", "relevant": [{"id": 1}]}', "queries.jsonl:2: field 'relevant'"),
    ],
)
def test_a_bad_query_line_is_refused_naming_its_line_and_field(
    dataset: tuple[Path, Path], line: str, says: str
) -> None:
    queries = dataset[1]
    first = queries.read_text().splitlines()[0]
    queries.write_text(f"{first}\n{line}\n")

    with pytest.raises(ManifestError, match=re.escape(says)):
        load_queries(queries, load_catalog(dataset[0]))


def test_a_query_line_that_is_not_utf8_is_refused_naming_its_line(
    dataset: tuple[Path, Path],
) -> None:
    dataset[1].write_bytes(b'{"query": "caf\xe9", "relevant": []}\n')

    with pytest.raises(ManifestError, match=r"queries.jsonl:1: is not UTF-8 text \(byte 0xe9"):
        load_queries(dataset[1], load_catalog(dataset[0]))


def test_a_query_without_an_id_is_named_by_its_line(dataset: tuple[Path, Path]) -> None:
    dataset[1].write_text('\n{"query": "weather in Oslo", "relevant": ["getWeather"]}\n')

    (query,) = load_queries(dataset[1], load_catalog(dataset[0]))

    assert query.id == f"{dataset[1]}:2"


def test_sample_is_fixed_by_the_seed(dataset: tuple[Path, Path]) -> None:
    queries = load_queries(dataset[1], load_catalog(dataset[0]))
    assert sample_queries(queries, 2, 5) == sample_queries(queries, 2, 5)
    assert sample_queries(queries, None, 0) == queries


def test_benchmark_returns_exactly_the_issue_keys(
    dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    figures = run_retrieval_benchmark(
        *dataset, embedder=HashingEmbedder(64), cache_dir=tmp_path / "cache"
    )
    assert set(figures) == FIGURE_KEYS
    assert set(figures["latency_ms"]) == {"p50", "p99"}
    assert set(figures["latency_with_embedding_ms"]) == {"p50", "p99", "n"}
    assert figures["latency_with_embedding_ms"]["n"] == 3
    assert figures["queries"] == 3 and figures["tools"] == 3
    assert figures["recall@5"] == pytest.approx(1.0)


def test_no_tool_queries_add_abstention_figures(dataset: tuple[Path, Path], tmp_path: Path) -> None:
    with dataset[1].open("a") as handle:
        handle.write(json.dumps({"id": "n1", "query": "bake bread", "relevant": []}) + "\n")
    figures = run_retrieval_benchmark(
        *dataset, embedder=HashingEmbedder(64), cache_dir=tmp_path / "cache"
    )
    assert set(figures) == FIGURE_KEYS | {"abstain_accuracy", "answer_rate"}


def test_without_abstention_no_answerable_query_goes_unanswered(
    dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    strict = DiscoveryConfig(abstain_threshold=0.99)  # abstains on nearly everything
    kept, off = (
        run_retrieval_benchmark(
            *dataset,
            embedder=HashingEmbedder(64),
            cache_dir=tmp_path / "cache",
            config=strict,
            abstain=abstain,
        )
        for abstain in (True, False)
    )

    assert kept["abstained_answerable"] > 0
    assert off["abstained_answerable"] == 0 and off["abstain"] is False


class RecordingEmbedder(HashingEmbedder):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts.extend(texts)
        return super().embed(texts)


def test_one_changed_text_is_the_only_one_embedded_again(tmp_path: Path) -> None:
    embed_cached(RecordingEmbedder(64), ["a tool", "b tool", "c tool"], tmp_path)
    embedder = RecordingEmbedder(64)

    again = embed_cached(embedder, ["a tool", "b tool changed", "c tool"], tmp_path)

    assert embedder.texts == ["b tool changed"]
    assert np.allclose(again[1], embedder.embed(["b tool changed"])[0])


def test_full_weight_one_embeds_and_stores_the_full_texts_alone(tmp_path: Path) -> None:
    caps = [
        Capability(
            id=f"tool:t{i}", kind="tool", name=f"t{i}", description=f"Does thing {i}.\n\nMore."
        )
        for i in range(3)
    ]
    embedder = RecordingEmbedder(32)

    snapshot = build_snapshot(caps, embedder, cache_dir=tmp_path, full_weight=1.0)

    fulls = [full_text(c) for c in caps]
    assert not set(embedder.texts) & ({summary_text(c) for c in caps} - set(fulls))
    np.testing.assert_allclose(snapshot.vectors(), embedder.embed(fulls), atol=1e-6)


class CountingEmbedder(HashingEmbedder):
    calls = 0

    def embed(self, texts: Sequence[str]) -> Matrix:
        CountingEmbedder.calls += 1
        return super().embed(texts)


def test_embeddings_are_cached_on_disk(tmp_path: Path) -> None:
    embedder = CountingEmbedder(16)
    first = embed_cached(embedder, ["a b", "c"], tmp_path)
    calls = CountingEmbedder.calls
    second = embed_cached(embedder, ["a b", "c"], tmp_path)
    assert CountingEmbedder.calls == calls
    np.testing.assert_array_equal(first, second)


def test_fit_logistic_learns_the_direction_of_the_evidence() -> None:
    features = np.array([[0.1], [0.2], [0.3], [0.6], [0.7], [0.8]])
    labels = np.array([0, 0, 1, 0, 1, 1], dtype=np.float64)
    bias, (weight,) = fit_logistic(features, labels)
    assert weight > 0
    assert bias + weight * 0.45 == pytest.approx(0.0, abs=0.5)


# -- calibration -----------------------------------------------------------------------------------


def _run(cosines: list[float]) -> BenchmarkRun:
    results = [
        RetrievalResult((RankedCapability("tool:x", 1.0, 0.5, (c, 0.0, 0.0)),), False)
        for c in cosines
    ]
    queries = [LabelledQuery(f"q{i}", "q", ("tool:x",)) for i in range(len(cosines))]
    return BenchmarkRun(queries, results, [], 1)


def test_the_floor_keeps_the_asked_share_of_every_split_answered() -> None:
    easy = _run([0.5 + i / 100 for i in range(40)])
    hard = _run([0.2 + i / 100 for i in range(40)])
    removed = [_run([0.1 + i / 200 for i in range(40)]), _run([0.15] * 40)]

    fitted = calibrated(DEFAULT_CONFIG, [easy, hard], removed, answer_rate=0.9)

    for split in (easy, hard):
        answered = [
            relevance((r.entries[0].evidence[0], 0.0, 0.0), fitted) >= fitted.abstain_threshold
            for r in split.results
        ]
        assert sum(answered) / len(answered) >= 0.9
    assert fitted.relevance_cosine > 0  # higher cosine, higher relevance


def test_answer_floor_of_no_queries_never_abstains() -> None:
    assert answer_floor(DEFAULT_CONFIG, _run([]), 0.95) == 0.0


def test_a_jsonl_catalog_reads_per_line_with_errors_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tools.jsonl"
    path.write_text(
        '{"id": "a", "description": "Does a."}\n\n[1, 2]\n{oops\n{"id": "b", "description": 42}\n'
    )

    read = read_jsonl_catalog(path, "jsonl:test")
    found, errors = read.found, read.errors

    assert [c.id for c in found.values()] == ["tool:a", "tool:b"]  # lenient: 42 -> "42"
    assert next(iter(found.values())).source_ref.source == "jsonl:test"
    assert sorted(str(p).rsplit(":", 1)[1] for p in errors) == ["3", "4"]
    assert str(errors[Path(f"{path}:3")]) == f"{path}:3: must be a JSON object"
    assert "is not JSON" in str(errors[Path(f"{path}:4")])


def test_labels_may_name_a_tool_by_its_unique_name(tmp_path: Path) -> None:
    tools = _write(
        tmp_path / "tools.jsonl",
        [
            {"id": "srv1/search", "name": "web_search", "description": "Search the web"},
            {"id": "srv2/search", "name": "search", "description": "Search files"},
            {"id": "srv3/search", "name": "search", "description": "Search mail"},
        ],
    )
    queries = _write(
        tmp_path / "queries.jsonl",
        [
            {"id": "q1", "query": "find pages about otters", "relevant": ["web_search"]},
            {"id": "q2", "query": "find my notes", "relevant": ["search"]},  # two tools: unknown
            {"id": "q3", "query": "look in my files", "relevant": ["srv2/search"]},
        ],
    )
    catalog = load_catalog(tools)

    found = {q.id: q.relevant for q in load_queries(queries, catalog)}

    assert found == {"q1": ("tool:srv1/search",), "q3": ("tool:srv2/search",)}
