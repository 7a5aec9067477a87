"""What one fresh query costs in the MiniLM model, by its length in tokens (a fresh turn's floor).

The model's time grows with the tokens of the query, so a fresh turn's floor depends on what
is asked: the one-request agent turns of ``benchmarks/registry_queries.jsonl`` against the
Seal-Tools queries, most of which chain several requests. Prints the token counts of both query
sets, then the model's median and p99 for one query of N tokens with 1 and 2 threads (the
discovery worker runs 2), measured in this run; then a query of 14 tokens (a one-request turn's
median) back to back and after 200 ms of idle, with onnxruntime's threads allowed to spin
between operators and not (``MiniLMEmbedder(spin=...)``): agent turns arrive after an idle
worker, not back to back.

    .venv/bin/python benchmarks/model_latency.py [--repeat 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import seal_queries
from _common import percentile
from capdisc.embedders.minilm import MiniLMEmbedder

HERE = Path(__file__).resolve().parent
LENGTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128)


def token_counts(model: MiniLMEmbedder, texts: list[str]) -> list[int]:
    _session, tokenizer = model._load()
    return [sum(e.attention_mask) for e in tokenizer.encode_batch(texts)]


def describe(label: str, counts: list[int]) -> None:
    print(
        f"{label:<44} tokens: median {float(np.median(counts)):5.0f}, p90 "
        f"{percentile(counts, 90):5.0f}, max {max(counts):4d} (n={len(counts)})"
    )


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def timed(model: MiniLMEmbedder, tokens: int, repeat: int, idle_s: float = 0.0) -> list[float]:
    ids = np.full((1, tokens), 2000, dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones_like(ids)
    for _ in range(5):
        model._run(ids, mask)
    samples = []
    for _ in range(repeat):
        if idle_s:
            time.sleep(idle_s)  # an idle worker between turns, not a wait for an event
        started = time.perf_counter()
        model._run(ids, mask)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    models = {threads: MiniLMEmbedder(threads=threads) for threads in (1, 2)}
    registry = [
        json.loads(line)["query"]
        for line in (HERE / "registry_queries.jsonl").read_text().splitlines()
        if line
    ]
    describe("one-request agent turns (registry queries)", token_counts(models[2], registry))
    describe("Seal-Tools queries", token_counts(models[2], seal_queries()))
    print()
    print(f"{'tokens':>6} " + "".join(f"{f'{t} thread(s): median / p99 ms':>34}" for t in models))
    for tokens in LENGTHS:
        cells = []
        for model in models.values():
            samples = timed(model, tokens, args.repeat)
            cells.append(f"{float(np.median(samples)):.2f} / {percentile(samples, 99):.2f}")
        print(f"{tokens:>6} " + "".join(f"{c:>34}" for c in cells))
    print()
    for spin in (False, True):
        model = MiniLMEmbedder(threads=2, spin=spin)
        cells = []
        for idle_s in (0.0, 0.2):
            repeat = min(args.repeat, 50) if idle_s else args.repeat
            before = cpu_s()
            samples = timed(model, 14, repeat, idle_s)
            cpu_ms = (cpu_s() - before) * 1000 / (repeat + 5)
            cells.append(
                f"{'after 200 ms idle' if idle_s else 'back to back'}: median "
                f"{float(np.median(samples)):.2f} / p99 {percentile(samples, 99):.2f} ms, "
                f"CPU {cpu_ms:.1f} ms a pass"
            )
        print(
            f"14 tokens, 2 threads, spinning {'allowed' if spin else 'off'}:\n  "
            + "\n  ".join(cells)
        )


if __name__ == "__main__":
    sys.exit(main())
