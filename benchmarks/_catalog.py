"""Benchmark catalogs: the shared data sets, grown to any size, and their vectors (cached).

``load_catalog(n)`` takes the Seal-Tools and MetaTool tools from ``../shared/data`` and, past
their 4,275 tools, adds variants (the same tool offered by another provider or region, and past
640,000 in another release, with its own name and a reworded description) so that a registry of
10,000 to 1,000,000 capabilities keeps the texture of real tool text. Vectors are cached under
``benchmarks/.cache/`` by embedder and text.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from capdisc.embedders.port import Embedder, Matrix
from capdisc.models import Capability
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.tolerance import tolerant_fields
from capdisc.retrieval.text import combine, full_text, summary_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
CACHE = Path(__file__).resolve().parent / ".cache"
PROVIDERS = [
    "acme",
    "globex",
    "initech",
    "umbrella",
    "hooli",
    "stark",
    "wayne",
    "wonka",
    "tyrell",
    "cyberdyne",
    "soylent",
    "aperture",
    "vandelay",
    "oscorp",
    "monarch",
]
REGIONS = ["eu", "us", "apac", "latam", "africa", "nordics", "canada", "india", "japan", "uk"]


def data_dir() -> Path:
    if not DATA.is_dir():
        raise SystemExit(
            f"benchmark data not found at {DATA}: the shared/ folder must sit beside the repository"
        )
    return DATA


def base_tools() -> list[dict[str, object]]:
    tools: list[dict[str, object]] = []
    for name in ("seal-tools", "metatool"):
        with (data_dir() / name / "tools.jsonl").open() as handle:
            tools += [json.loads(line) for line in handle]
    return tools


def to_capability(tool: dict[str, object], suffix: str = "", prefix: str = "") -> Capability:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{tool['name']}{suffix}").strip("-")[:64]
    schema = tool.get("parameters") if isinstance(tool.get("parameters"), dict) else None
    # Repaired as an import repairs it (a few Seal-Tools schemas give `examples` as one string).
    repaired, _notes = tolerant_fields({"parameters": schema}, "parameters", f"catalog:{name}")
    category = re.sub(r"[^a-z0-9._-]+", "-", str(tool.get("category") or "general").lower())
    record = {
        "kind": "tool",
        "name": name,
        "description": f"{prefix}{tool['description']}"[:4000],
        "category": category.strip("-")[:64] or "general",
        "full_schema": repaired["parameters"],
    }
    return capability_from_record(record, f"catalog:{name}")


def load_catalog(size: int) -> list[Capability]:
    """``size`` capabilities: the real tools first, then provider/region variants."""
    tools = base_tools()
    caps: dict[str, Capability] = {}
    for tool in tools:
        cap = to_capability(tool)
        caps.setdefault(cap.id, cap)
    variant = 0
    while len(caps) < size:
        tool = tools[variant % len(tools)]
        provider = PROVIDERS[(variant // len(tools)) % len(PROVIDERS)]
        region = REGIONS[(variant // (len(tools) * len(PROVIDERS))) % len(REGIONS)]
        edition = variant // (len(tools) * len(PROVIDERS) * len(REGIONS))
        release = f"-v{edition + 1}" if edition else ""  # past 640,000 variants: releases
        cap = to_capability(
            tool,
            f"-{provider}-{region}{release}",
            f"{provider.title()} {region.upper()} edition{release.replace('-', ' ')}. ",
        )
        caps.setdefault(cap.id, cap)
        variant += 1
    return list(caps.values())[:size]


def embed_catalog(caps: list[Capability], embedder: Embedder, batch: int = 64) -> Matrix:
    """Stored vectors of ``caps`` as the indexing worker makes them (:func:`combine` of the
    full text's and the summary's embeddings), each side cached on disk."""
    full = embed_texts([full_text(c) for c in caps], embedder, batch)
    summary = embed_texts([summary_text(c) for c in caps], embedder, batch)
    return np.stack([combine(f, s) for f, s in zip(full, summary, strict=True)])


def stand_in_vectors(caps: list[Capability], embedder: Embedder, batch: int = 4096) -> Matrix:
    """Stored vectors of ``caps`` as :func:`embed_catalog` makes them but from a cheap embedder
    (the hashing one: the same size and arithmetic, relevance meaningless) and not cached."""
    rows = []
    for start in range(0, len(caps), batch):
        chunk = caps[start : start + batch]
        rows.append(
            combine(
                embedder.embed([full_text(c) for c in chunk]),
                embedder.embed([summary_text(c) for c in chunk]),
            )
        )
    return np.vstack(rows).astype(np.float32)


def embed_texts(texts: list[str], embedder: Embedder, batch: int = 64) -> Matrix:
    CACHE.mkdir(exist_ok=True)
    digest = hashlib.sha256("\n\x00".join(texts).encode()).hexdigest()[:24]
    path = CACHE / f"{embedder.id}-{digest}.npy"
    if path.exists():
        cached: Matrix = np.load(path)
        return cached
    rows = [embedder.embed(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    matrix = (
        np.vstack(rows).astype(np.float32)
        if rows
        else np.zeros((0, embedder.dim), dtype=np.float32)
    )
    np.save(path, matrix)
    return matrix


def seal_queries() -> list[str]:
    with (data_dir() / "seal-tools" / "queries.jsonl").open() as handle:
        return [json.loads(line)["query"] for line in handle]
