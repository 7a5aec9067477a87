"""``capdisc bench retrieval`` and ``capdisc bench tokens`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from capdisc_producers.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("CAPDISC_BENCH_CACHE", str(tmp_path / "cache"))
    tools = _write(
        tmp_path / "tools.jsonl",
        [
            {
                "id": "getWeather",
                "name": "getWeather",
                "description": "Weather forecast for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "category": "info",
            },
            {
                "id": "sendEmail",
                "name": "sendEmail",
                "description": "Send an email message",
                "parameters": None,
                "category": "mail",
            },
        ],
    )
    queries = _write(
        tmp_path / "queries.jsonl",
        [
            {"id": "q1", "query": "weather forecast in Oslo", "relevant": ["getWeather"]},
            {"id": "q2", "query": "send an email message to Ann", "relevant": ["sendEmail"]},
            {"id": "q3", "query": "tell me a joke", "relevant": []},
        ],
    )
    return tools, queries


def invoke(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, [*args, "--embedder", "hashing", "--json"])
    assert result.exit_code == 0, result.output
    figures: dict[str, object] = json.loads(result.stdout)
    return figures


def test_bench_retrieval_prints_the_issue_keys_with_abstention(dataset: tuple[Path, Path]) -> None:
    figures = invoke("bench", "retrieval", "--tools", str(dataset[0]), "--queries", str(dataset[1]))

    assert {
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
        "abstain_accuracy",
        "answer_rate",
    } == set(figures)
    assert figures["recall@5"] == 1.0 and figures["tools"] == 2


def test_bench_tokens_compares_the_static_dump_with_the_tiered_answer(
    dataset: tuple[Path, Path],
) -> None:
    report = invoke("bench", "tokens", "--tools", str(dataset[0]), "--queries", str(dataset[1]))

    assert report["capabilities"] == 2 and report["queries"] == 3
    assert report["over_budget_turns"] == 0
    assert isinstance(report["static_dump_tokens"], int) and report["static_dump_tokens"] > 0


def test_bench_tokens_on_the_example_registry_saves_ninety_percent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPDISC_BENCH_CACHE", str(tmp_path / "cache"))

    report = invoke(
        "bench", "tokens", "--registry", str(ROOT / "examples" / "registry"), "--sample", "20"
    )

    assert report["capabilities"] == 98
    assert isinstance(report["saving"], float) and report["saving"] >= 0.9


def test_bench_tokens_needs_exactly_one_catalog() -> None:
    result = CliRunner().invoke(cli, ["bench", "tokens"])

    assert result.exit_code == 2
    assert "exactly one of --tools and --registry" in result.output


def test_bench_tokens_on_a_registry_with_nothing_readable_fails_listing_the_refusals(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "registry" / "broken" / "CAPABILITY.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("name: [unclosed\n")

    result = CliRunner().invoke(cli, ["bench", "tokens", "--registry", str(broken.parents[1])])

    assert result.exit_code == 1
    assert f"refused: {broken}: is not valid YAML" in result.output
    assert "no capability could be read from" in result.output
    assert "(1 refused, listed above)" in result.output


def test_bench_tokens_refuses_a_query_line_without_a_question(tmp_path: Path) -> None:
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"id": "q1", "relevant": []}\n')
    registry = str(ROOT / "examples" / "registry")

    result = CliRunner().invoke(
        cli, ["bench", "tokens", "--registry", registry, "--queries", str(queries)]
    )

    assert result.exit_code == 1
    assert "queries.jsonl:1: field 'query': must be a non-empty string" in result.output
