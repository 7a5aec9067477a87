"""Tool-poisoning scanner: how many poisoned tools it catches, how many benign ones it flags,
and how fast it is.

Poisoned: ``benchmarks/data/poisoning/canaries.jsonl`` (original text in the styles of the
public write-ups, each tagged with its style; the rules were tuned on them) and
``canaries_holdout.jsonl`` (written after the rules were frozen and never tuned on: an estimate
of how the rules do on phrasings they were not fitted to). Benign: the Seal-Tools (4,076) and
MetaTool (199) catalogs of ``../shared/data`` and the example registry, which the targets are
set on (at least 95% of canaries flagged, at most 1% of the benign capabilities), and
``benign_hard.jsonl``, benign tools that talk about passwords, files, tokens and URLs on
purpose (never tuned on). Every jsonl file is converted the way ``capdisc import jsonl``
converts it; lines it refuses are counted and skipped. Every benign capability that is flagged
is printed with its findings, so a reader can judge them.

    .venv/bin/python benchmarks/poisoning.py > benchmarks/results/poisoning.txt
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capdisc.models import Capability
from capdisc.registry.catalogs import read_jsonl_catalog
from capdisc.registry.manifest import scan_directory
from capdisc.registry.poisoning import Finding, scan_capability

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "data" / "poisoning"
SHARED = ROOT.parent / "shared" / "data"
TIMING_ROUNDS = 3


@dataclass
class Catalog:
    """One named set of capabilities, how many source lines were refused, and the findings."""

    name: str
    capabilities: list[Capability]
    refused: int
    findings: dict[str, tuple[Finding, ...]]

    @property
    def flagged(self) -> list[Capability]:
        return [c for c in self.capabilities if self.findings[c.id]]


def main() -> None:
    canaries = _scanned("canaries", *_jsonl(CORPUS / "canaries.jsonl"))
    holdout = _scanned("held-out canaries", *_jsonl(CORPUS / "canaries_holdout.jsonl"))
    hard = _scanned("hard benign", *_jsonl(CORPUS / "benign_hard.jsonl"))
    benign = [
        _scanned("Seal-Tools", *_jsonl(SHARED / "seal-tools" / "tools.jsonl")),
        _scanned("MetaTool", *_jsonl(SHARED / "metatool" / "tools.jsonl")),
        _scanned("example registry", *_registry(ROOT / "examples" / "registry")),
    ]
    _report_poisoned(
        canaries,
        CORPUS / "canaries.jsonl",
        "Poisoned tools (canaries.jsonl; the rules were tuned on them)",
    )
    _report_poisoned(
        holdout,
        CORPUS / "canaries_holdout.jsonl",
        "Held-out poisoned tools (canaries_holdout.jsonl; written after the rules "
        "were frozen, never tuned on)",
    )
    _report_benign(benign, hard)
    _report_speed([c for cat in (canaries, holdout, hard, *benign) for c in cat.capabilities])


def _jsonl(path: Path) -> tuple[list[Capability], int]:
    read = read_jsonl_catalog(path, f"jsonl:{path.name}")
    return list(read.found.values()), len(read.refused)


def _registry(root: Path) -> tuple[list[Capability], int]:
    result = scan_directory(root)
    return list(result.capabilities.values()), len(result.errors)


def _scanned(name: str, capabilities: list[Capability], refused: int) -> Catalog:
    return Catalog(name, capabilities, refused, {c.id: scan_capability(c) for c in capabilities})


# -- report ---------------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{part:,} / {whole:,} ({100 * part / whole:.1f}%)" if whole else "0 / 0"


def _report_poisoned(canaries: Catalog, path: Path, title: str) -> None:
    styles = _styles(path)
    flagged = canaries.flagged
    print(title)
    print(
        f"  flagged            {_share(len(flagged), len(canaries.capabilities))}"
        f"{_refused(canaries)}"
    )
    by_style: dict[str, list[bool]] = defaultdict(list)
    rules: Counter[str] = Counter()
    for cap in canaries.capabilities:
        by_style[styles.get(cap.source_ref.location, "?")].append(bool(canaries.findings[cap.id]))
        rules.update({f.rule for f in canaries.findings[cap.id]})
    print("  by style (flagged / total)")
    for style, hits in sorted(by_style.items()):
        print(f"    {style:<24} {sum(hits):>3} / {len(hits):<3}")
    print("  canaries each rule fired on")
    for rule, count in rules.most_common():
        print(f"    {rule:<24} {count:>3}")
    missed = [c for c in canaries.capabilities if not canaries.findings[c.id]]
    print("  missed" + ("" if missed else ": none"))
    for cap in missed:
        print(
            f"    {cap.source_ref.location} {cap.name} [{styles.get(cap.source_ref.location)}]: "
            f"{cap.description[:110]!r}"
        )
    print()


def _styles(path: Path) -> dict[str, str]:
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return {str(row["id"]): str(row.get("style", "?")) for row in rows}


def _refused(catalog: Catalog) -> str:
    return (
        f"   ({catalog.refused} lines refused by the importer, skipped)" if catalog.refused else ""
    )


def _report_benign(benign: Sequence[Catalog], hard: Catalog) -> None:
    print("Benign capabilities flagged (target: at most 1% pooled)")
    for catalog in benign:
        print(
            f"  {catalog.name:<18} {_share(len(catalog.flagged), len(catalog.capabilities))}"
            f"{_refused(catalog)}"
        )
    pooled = sum(len(c.flagged) for c in benign)
    total = sum(len(c.capabilities) for c in benign)
    print(f"  {'pooled':<18} {_share(pooled, total)}")
    print(
        f"  {'hard benign':<18} {_share(len(hard.flagged), len(hard.capabilities))}"
        "   (benign text about passwords, files, tokens and links; not tuned on)"
    )
    print()
    print("Rules that fired on benign capabilities")
    rules = Counter(
        f.rule for cat in (*benign, hard) for found in cat.findings.values() for f in found
    )
    for rule, count in rules.most_common():
        print(f"  {rule:<24} {count:>3}")
    print()
    print("Every flagged benign capability, with its findings")
    for catalog in (*benign, hard):
        for cap in catalog.flagged:
            print(f"  [{catalog.name}] {cap.id}")
            for finding in catalog.findings[cap.id]:
                print(f"      {finding.rule} at {finding.where}: {finding.reason}")
                print(f"        {finding.excerpt!r}")
    print()


def _report_speed(capabilities: Sequence[Capability]) -> None:
    """Per-capability scan time (the best of a few rounds each, so scheduler noise is not
    counted), and throughput over one full round."""
    best: list[float] = [float("inf")] * len(capabilities)
    rounds: list[float] = []
    for _ in range(TIMING_ROUNDS):
        started = time.perf_counter()
        for index, capability in enumerate(capabilities):
            t0 = time.perf_counter()
            scan_capability(capability)
            best[index] = min(best[index], time.perf_counter() - t0)
        rounds.append(time.perf_counter() - started)
    micros = sorted(t * 1e6 for t in best)
    p99 = micros[min(len(micros) - 1, round(0.99 * (len(micros) - 1)))]
    print(
        f"Scanning speed ({len(capabilities):,} capabilities, one thread, best of "
        f"{TIMING_ROUNDS} rounds per capability)"
    )
    print(
        f"  median {statistics.median(micros):.0f} µs, p99 {p99:.0f} µs, "
        f"max {micros[-1]:.0f} µs per capability"
    )
    print(f"  throughput {len(capabilities) / min(rounds):,.0f} capabilities/s")


if __name__ == "__main__":
    main()
