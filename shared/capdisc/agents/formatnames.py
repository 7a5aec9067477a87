"""The names of the tool formats (:mod:`capdisc.agents.formats` builds the definitions).

Kept apart from the builders and light to import: the wire protocol checks a request's
``tool_format`` against them, and the ``capdisc`` command offers them as choices, without
loading the builders and the tool-poisoning flags they mark tools with.
"""

from __future__ import annotations

from typing import Literal

ToolFormat = Literal["openai-chat", "openai-responses", "anthropic", "mcp"]
TOOL_FORMATS: tuple[ToolFormat, ...] = ("openai-chat", "openai-responses", "anthropic", "mcp")
