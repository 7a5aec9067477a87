"""What each embedded text of a capability costs the model: the full text against the summary.

An indexing worker embeds two texts per capability (:func:`capdisc.retrieval.text.
embedding_texts`: the full text and the summary) and stores their weighted sum. This prints the
model's own time on each view's distinct texts of the bulk-import benchmark catalog (the same
catalog and the same embedder a worker makes from the environment's settings, in this process,
after a warm-up call), their tokens, and the share of the two views' time the summaries take:
what one embedded text per capability would save an import. Each view is timed twice,
alternately (full, summary, full, summary), and the faster pass counts, so a burst of other
work on the machine does not decide the share. The quality side of the same choice is
``generalization.py --full-weight 1.0`` (docs/benchmarks.md, "Texts embedded per capability").

    .venv/bin/python benchmarks/embedding_views.py [--size 10000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog
from capdisc.embedders.minilm import MiniLMEmbedder
from capdisc.embedders.port import Embedder
from capdisc.resources import embedder_for
from capdisc.retrieval.text import embedding_texts
from capdisc.settings import Settings
from model_latency import token_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    pairs = [embedding_texts(c) for c in load_catalog(args.size)]
    views = {
        "full": list(dict.fromkeys(full for full, _ in pairs)),
        "summary": list(dict.fromkeys(summary for _, summary in pairs)),
    }
    embedder = embedder_for(Settings())
    embedder.embed(views["summary"][:64])  # loads the model; not timed
    load_start = os.getloadavg()
    passes: dict[str, list[float]] = {name: [] for name in views}
    for _ in range(2):
        for name, texts in views.items():
            passes[name].append(timed(embedder, texts))
    figures: dict[str, Any] = {
        "capabilities": len(pairs),
        "embedder_id": embedder.id,
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "views": {
            name: view_figures(embedder, texts, passes[name]) for name, texts in views.items()
        },
    }
    both = sum(v["model_s"] for v in figures["views"].values())
    figures["summary_share_of_model_time"] = round(figures["views"]["summary"]["model_s"] / both, 3)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


def timed(embedder: Embedder, texts: list[str]) -> float:
    started = time.perf_counter()
    vectors = embedder.embed(texts)
    took_s = time.perf_counter() - started
    if len(vectors) != len(texts):
        raise SystemExit(f"the embedder gave {len(vectors)} vectors for {len(texts)} texts")
    return took_s


def view_figures(embedder: Embedder, texts: list[str], passes: list[float]) -> dict[str, Any]:
    model_s = min(passes)
    figures: dict[str, Any] = {
        "texts": len(texts),
        "model_s": round(model_s, 2),
        "passes_s": [round(p, 2) for p in passes],
        "texts_per_s": round(len(texts) / model_s, 1),
    }
    if isinstance(embedder, MiniLMEmbedder):
        counts = token_counts(embedder, texts)
        figures["tokens"] = sum(counts)
        figures["tokens_median"] = sorted(counts)[len(counts) // 2]
    return figures


def report(figures: dict[str, Any]) -> None:
    print(
        f"{figures['capabilities']:,} capabilities of the bulk-import catalog, "
        f"{figures['embedder_id']}, load {figures['loadavg_start']} -> {figures['loadavg_end']}"
    )
    print(f"{'view':<8} {'texts':>7} {'tokens':>9} {'median':>6} {'model s':>8} {'texts/s':>8}")
    for name, view in figures["views"].items():
        print(
            f"{name:<8} {view['texts']:>7,} {view.get('tokens', 0):>9,} "
            f"{view.get('tokens_median', 0):>6} {view['model_s']:>8.2f} {view['texts_per_s']:>8.1f}"
            f"   (passes {view['passes_s']})"
        )
    print(
        "the summaries' share of the two views' model time: "
        f"{figures['summary_share_of_model_time']:.1%} (what one text per capability saves)"
    )


if __name__ == "__main__":
    main()
