"""The document BM25 indexes for a capability (:func:`lexical_text`): the retriever's lexical
side and the in-process vector store's keyword side both match this text.
"""

from __future__ import annotations

from collections.abc import Iterable

from capdisc.identifiers import split_identifiers
from capdisc.models import Capability
from capdisc.retrieval import text
from capdisc.retrieval.text import ServerContext, server_of


def lexical_text(capability: Capability, servers: ServerContext | None = None) -> str:
    """What BM25 matches: names (identifiers split), description, category, tags, parameters
    with their descriptions, dependencies and example queries; with ``servers.lexical`` (the
    default: :data:`capdisc.retrieval.text.SERVER_CONTEXT`) also the name words of the MCP
    server it came from (:func:`capdisc.retrieval.text.server_of`)."""
    lines = [
        capability.name,
        capability.display_name,
        capability.description,
        split_identifiers(capability.category),
        " ".join(capability.tags),
    ]
    lines.extend(_parameter_lines(capability))
    lines.extend(capability.required_tools)
    lines.extend(capability.example_queries)
    if (servers or text.SERVER_CONTEXT).lexical:
        lines.append(server_of(capability))
    return "\n".join(line for line in lines if line)


def _parameter_lines(capability: Capability) -> Iterable[str]:
    properties = (capability.full_schema or {}).get("properties")
    if not isinstance(properties, dict):
        return
    for name, spec in properties.items():
        description = spec.get("description") if isinstance(spec, dict) else None
        yield f"{name} {description}" if isinstance(description, str) else str(name)
