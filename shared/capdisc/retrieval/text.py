"""The texts a capability is embedded and matched by (docs/design.md, "Embedding texts").

:func:`full_text` (display name and description, parameters with their descriptions, tags,
dependencies, example queries) and :func:`summary_text` (display name and the description's
first paragraph) measured best on the benchmark data; a category line and the raw name in
parentheses cost recall. A tool imported from an MCP server has the server's name before its
own in the full text (``github: List Pull Requests: ...``), and BM25 matches the server's name
words too (:data:`SERVER_CONTEXT`): requests that name the server or the tool family reach the
tool. Never the full schema, the full content or secrets.

A capability's stored vector is :func:`combine` of the two texts' embeddings: cosine with a
query is then the weighted mean of the two views' cosines, in one row. :func:`vector_space`
names vectors made this way, so vectors of another embedder or scheme are never mixed in.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from capdisc.embedders.port import Vector
from capdisc.identifiers import humanize, split_identifiers
from capdisc.models import Capability

_PARAGRAPH = re.compile(r"\n\s*\n")
#: ``source_ref.type`` of the capabilities ``capdisc import mcp`` makes.
MCP_SOURCE = "mcp"


@dataclass(frozen=True)
class ServerContext:
    """Which texts name the MCP server a capability was imported from (:func:`server_of`):
    ``lexical`` its name words in the BM25 text, ``full`` and ``summary`` its name before the
    capability's in the embedded texts, ``described`` what the server says of itself
    (``source_ref.description``) on the full text's last line. Capabilities of no server have
    the same texts whatever is set. ``benchmarks/generalization.py --servers`` measures other
    choices."""

    lexical: bool = False
    full: bool = False
    summary: bool = False
    described: bool = False


#: What the texts carry of the server: its name in the BM25 text and in the full text, not in
#: the summary (which lost multi-step recall; docs/benchmarks.md, "Generalization").
SERVER_CONTEXT = ServerContext(lexical=True, full=True)


def server_of(capability: Capability) -> str:
    """The MCP server ``capability`` was imported from, as words (``desktop commander``):
    ``capdisc import mcp`` files each tool under its server (``category``, ``source_ref.type``
    ``mcp``). Empty for a capability of any other source."""
    if capability.source_ref.type != MCP_SOURCE:
        return ""
    return split_identifiers(capability.category)


def full_text(capability: Capability, servers: ServerContext | None = None) -> str:
    """The main embedding text of ``capability``."""
    server = server_of(capability) if (servers or SERVER_CONTEXT).full else ""
    name = capability.display_name or humanize(capability.name)
    lines = [f"{_named(server, name)}: {capability.description.strip()}"]
    params = _parameter_phrases(capability)
    if params:
        lines.append("Parameters: " + "; ".join(params))
    if capability.tags:
        lines.append("Use cases: " + ", ".join(capability.tags))
    if capability.required_tools:
        lines.append("Requires: " + ", ".join(capability.required_tools))
    if capability.example_queries:
        lines.append("Examples: " + "; ".join(capability.example_queries))
    about = _server_description(capability, servers or SERVER_CONTEXT)
    if about:
        lines.append(f"Server: {about}")
    return "\n".join(lines)


def _server_description(capability: Capability, servers: ServerContext) -> str:
    """What the tool's MCP server says of itself, when the texts carry it."""
    if not servers.described or not server_of(capability):
        return ""
    return capability.source_ref.description.strip()


#: How the stored vector is made from the texts' embeddings; part of :func:`vector_space`.
VECTOR_SCHEME = "fs1"
#: Weight of the full-text view against the summary view in the stored vector.
FULL_TEXT_WEIGHT = 0.5


def embedding_texts(
    capability: Capability, servers: ServerContext | None = None
) -> tuple[str, str]:
    """What the indexing worker embeds for a capability: the full text and the summary."""
    return full_text(capability, servers), summary_text(capability, servers)


def combine(full: Vector, summary: Vector, full_weight: float = FULL_TEXT_WEIGHT) -> Vector:
    """The stored vector: ``w * full + (1 - w) * summary`` (both L2-normalized, the sum not)."""
    mixed: Vector = full_weight * np.asarray(full, dtype=np.float32) + (
        1.0 - full_weight
    ) * np.asarray(summary, dtype=np.float32)
    return mixed.astype(np.float32)


def vector_space(embedder_id: str) -> str:
    """The id stored vectors are kept under: the embedder and :data:`VECTOR_SCHEME`."""
    return f"{embedder_id}.{VECTOR_SCHEME}"


def embedder_id_of(space: str) -> str:
    """The embedder id of a vector space named by :func:`vector_space`."""
    return space.removesuffix(f".{VECTOR_SCHEME}")


def summary_text(capability: Capability, servers: ServerContext | None = None) -> str:
    """The short second view: display name and the description's first paragraph."""
    server = server_of(capability) if (servers or SERVER_CONTEXT).summary else ""
    name = capability.display_name or humanize(capability.name)
    first = _PARAGRAPH.split(capability.description.strip(), maxsplit=1)[0].strip()
    return f"{_named(server, name)}: {first}"


def _named(server: str, name: str) -> str:
    """``server: name``, or the name alone."""
    return f"{server}: {name}" if server else name


def _parameter_phrases(capability: Capability) -> list[str]:
    properties = (capability.full_schema or {}).get("properties")
    if not isinstance(properties, dict):
        return []
    phrases = []
    for key, spec in properties.items():
        words = split_identifiers(str(key)).lower()
        about = spec.get("description") if isinstance(spec, dict) else None
        phrases.append(
            f"{words} ({about.strip()})" if isinstance(about, str) and about.strip() else words
        )
    return phrases


def text_hash(text: str) -> str:
    """Key of the shared embedding cache."""
    return hashlib.sha256(text.encode()).hexdigest()
