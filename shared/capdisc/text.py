"""The texts a capability is embedded and matched by (seed 001, "Embedding Strategy").

:func:`full_text` (display name and description, parameters with their descriptions, tags,
dependencies, example queries) and :func:`summary_text` (display name and the description's
first paragraph) measured best on the benchmark data; a category line and the raw name in
parentheses cost recall. Never the full schema, the full content or secrets.
"""

from __future__ import annotations

import hashlib
import re

from capdisc.lexical import split_identifiers
from capdisc.models import Capability

_PARAGRAPH = re.compile(r"\n\s*\n")


def full_text(capability: Capability) -> str:
    """The main embedding text of ``capability``."""
    name = capability.display_name or humanize(capability.name)
    lines = [f"{name}: {capability.description.strip()}"]
    params = _parameter_phrases(capability)
    if params:
        lines.append("Parameters: " + "; ".join(params))
    if capability.tags:
        lines.append("Use cases: " + ", ".join(capability.tags))
    if capability.required_tools:
        lines.append("Requires: " + ", ".join(capability.required_tools))
    if capability.example_queries:
        lines.append("Examples: " + "; ".join(capability.example_queries))
    return "\n".join(lines)


#: What the indexing worker embeds for a capability.
embedding_text = full_text


def summary_text(capability: Capability) -> str:
    """The short second view: display name and the description's first paragraph."""
    name = capability.display_name or humanize(capability.name)
    first = _PARAGRAPH.split(capability.description.strip(), maxsplit=1)[0].strip()
    return f"{name}: {first}"


def humanize(name: str) -> str:
    """``getWeatherForecast`` -> ``Get Weather Forecast``."""
    parts = split_identifiers(name).split()
    return " ".join(p[:1].upper() + p[1:] for p in parts) or name


def _parameter_phrases(capability: Capability) -> list[str]:
    properties = (capability.full_schema or {}).get("properties")
    if not isinstance(properties, dict):
        return []
    phrases = []
    for key, spec in properties.items():
        words = split_identifiers(str(key)).lower()
        about = spec.get("description") if isinstance(spec, dict) else None
        phrases.append(f"{words} ({about.strip()})" if isinstance(about, str) and about.strip()
                       else words)
    return phrases


def text_hash(text: str) -> str:
    """Key of the shared embedding cache."""
    return hashlib.sha256(text.encode()).hexdigest()
