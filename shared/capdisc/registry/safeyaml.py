"""Strict YAML loading for untrusted manifests.

PyYAML's ``safe_load`` still expands aliases (billion laughs), keeps the last of duplicate keys,
honours merge keys and accepts several documents. :func:`load_mapping` refuses all of these and
nesting deeper than :data:`MAX_DEPTH`, and reports every problem (a number or date it cannot
represent too) as a :class:`ManifestError` with
the line it was found on.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, NodeEvent
from yaml.nodes import MappingNode, Node

from capdisc.errors import ManifestError

MAX_DEPTH = 32


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases, anchors, merge keys, duplicate keys or deep nesting."""

    def __init__(self, stream: str, source: str) -> None:
        super().__init__(stream)
        self.source = source
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1
        if isinstance(event, AliasEvent):
            raise ManifestError(
                self.source, None, f"line {line}: YAML aliases (*name) are not allowed"
            )
        if isinstance(event, NodeEvent) and event.anchor is not None:
            raise ManifestError(
                self.source, None, f"line {line}: YAML anchors (&name) are not allowed"
            )
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ManifestError(
                self.source, None, f"line {line}: nested deeper than {MAX_DEPTH} levels"
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            value = super().construct_object(node, deep=deep)
            if isinstance(value, int):
                str(value)  # one in hex may be too long to print, and to send as JSON
            return value
        except ManifestError:
            raise
        except ValueError as exc:  # an integer past 4300 digits, a date such as 2024-13-45
            text = str(node.value)
            shown = text if len(text) <= 20 else f"{text[:20]}..."
            raise ManifestError(
                self.source,
                None,
                f"line {node.start_mark.line + 1}: {shown!r} cannot be read as a number or date; "
                "quote it if it is text",
            ) from exc

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise ManifestError(
                    self.source, None, f"line {line}: YAML merge keys (<<) are not allowed"
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ManifestError(
                    self.source, None, f"line {line}: mapping key {key!r} must be a string"
                )
            if key in seen:
                raise ManifestError(
                    self.source, key, f"line {line}: duplicate key (it appears more than once)"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_mapping(text: str, source: str) -> dict[str, Any]:
    """Parse one YAML document that must be a mapping."""
    if "\x00" in text:
        raise ManifestError(source, None, "contains a NUL byte; is it a binary file?")
    loader = _StrictLoader(text, source)
    try:
        data = loader.get_single_data()
    except ManifestError:
        raise
    except ComposerError as exc:
        raise ManifestError(
            source, None, f"must hold exactly one YAML document ({exc.problem})"
        ) from exc
    except ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise ManifestError(source, None, f"line {line}: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ManifestError(source, None, f"is not valid YAML: {exc}") from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ManifestError(source, None, f"must be a YAML mapping of fields, but it is {kind}")
    return data
