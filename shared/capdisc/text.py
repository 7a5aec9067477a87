"""The text a capability is embedded and matched by (seed 001, "Embedding Strategy").

Name and display name, description, category, tags, parameter names, dependencies and example
queries; never the full schema, the full content or secrets.
"""

from __future__ import annotations

import hashlib

from capdisc.models import Capability


def embedding_text(capability: Capability) -> str:
    """A compact, intent-oriented description of ``capability`` for the embedder."""
    lines = [f"{capability.display_name or capability.name} ({capability.name})",
             capability.description.strip()]
    lines.append(f"Category: {capability.category}")
    if capability.tags:
        lines.append("Use cases: " + ", ".join(capability.tags))
    if capability.parameter_names:
        lines.append("Parameters: " + ", ".join(capability.parameter_names))
    if capability.required_tools:
        lines.append("Requires: " + ", ".join(capability.required_tools))
    if capability.example_queries:
        lines.append("Examples: " + "; ".join(capability.example_queries))
    return "\n".join(lines)


def text_hash(text: str) -> str:
    """Key of the shared embedding cache."""
    return hashlib.sha256(text.encode()).hexdigest()
