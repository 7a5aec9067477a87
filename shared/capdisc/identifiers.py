"""Identifiers as words: ``getWeatherForecast``, ``list_pull-requests`` and ``PDF_URLTool`` split
into the words they are made of, and a name made readable for people (``Get Weather Forecast``).

Both the text a capability is matched by (:mod:`capdisc.retrieval`) and the display names the
catalog readers give imported tools (:mod:`capdisc.registry.catalogs`) use them.
"""

from __future__ import annotations

import re

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)


def split_identifiers(text: str) -> str:
    """``getWeatherForecast`` -> ``get Weather Forecast``; ``list_pull-requests`` -> words."""
    return " ".join(_CAMEL.sub(" ", word) for word in _TOKEN.findall(text))


def humanize(name: str) -> str:
    """``getWeatherForecast`` -> ``Get Weather Forecast``."""
    parts = split_identifiers(name).split()
    return " ".join(p[:1].upper() + p[1:] for p in parts) or name
