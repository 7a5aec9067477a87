"""Regression tests for bugs found while writing the unit tests; each states the intended
behaviour the fix gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.port import check_vectors
from capdisc.errors import ConfigError, EmbeddingError, EventDecodeError, ManifestError
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.manifest import load_manifest, parse_manifest_text
from capdisc.registry.normalize import capability_from_record, from_extension
from capdisc.settings import Settings

MINIMAL = "name: web-search\nkind: tool\ndescription: Searches the public web.\n"
RECORD = {"kind": "tool", "name": "web-search", "description": "Searches the public web."}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "web-search\n"),
        ("id", "tool:web-search\n"),
        ("category", "search\n"),
        ("tags", ["search\n"]),
        ("required_secrets", ["SEARCH_API_KEY\n"]),
    ],
)
def test_identifier_with_a_trailing_newline_is_rejected(field: str, value: object) -> None:
    with pytest.raises(ManifestError):
        capability_from_record({**RECORD, field: value}, "src")


def test_tenant_with_a_trailing_newline_is_rejected() -> None:
    event = RegistryEvent(type="delete", tenant="acme\n", capability_id="tool:a", seq=1)

    with pytest.raises(EventDecodeError):
        RegistryEvent.decode(event.encode())


@pytest.mark.parametrize("installed", ["false", "no", 1])
def test_extension_installed_must_be_a_boolean(installed: object) -> None:
    with pytest.raises(ManifestError):
        from_extension({"name": "github", "description": "d", "installed": installed})


@pytest.mark.parametrize("value", ["[1, 2]", "5", "fast"])
def test_settings_file_discovery_that_is_not_a_mapping_is_a_config_error(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "capdisc.yaml"
    path.write_text(f"discovery: {value}\n", encoding="utf-8")

    with pytest.raises(ConfigError):
        Settings.load(environ={}, path=path)


def test_build_with_a_repeated_id_keeps_ids_and_rows_aligned() -> None:
    a = Capability(id="tool:a", kind="tool", name="a", description="a")
    b = Capability(id="tool:b", kind="tool", name="b", description="b")
    rows = [np.array(v, dtype=np.float32).tobytes() for v in ([1, 0], [0, 1], [0.6, 0.8])]

    snapshot = IndexSnapshot.build("t", 1, 2, [(a, rows[0]), (b, rows[1]), (a, rows[2])])

    assert snapshot.matrix.shape == (len(snapshot.ids), 2)


@pytest.mark.parametrize(
    "vectors", [[[1.0, 0.0], [1.0]], [["a", "b"], ["c", "d"]]], ids=["ragged", "strings"]
)
def test_check_vectors_rejects_a_ragged_or_non_numeric_answer(vectors: object) -> None:
    with pytest.raises(EmbeddingError):
        check_vectors(vectors, 2, 2, "model")


def test_unknown_field_error_does_not_offer_a_refused_field() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest_text(MINIMAL + "colour: red\n", "m.yaml")

    assert "full_schema" not in info.value.problem


def test_schema_error_names_the_key_the_manifest_used() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest_text(MINIMAL + "parameters: {type: array}\n", "m.yaml")

    assert info.value.field == "parameters"


def test_tags_differing_only_in_case_are_one_tag() -> None:
    record = {**RECORD, "tags": ["Search", "search"]}

    assert capability_from_record(record, "src").tags == ("search",)


def test_skill_md_symlink_pointing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret\n", encoding="utf-8")
    capability_dir = tmp_path / "cap"
    capability_dir.mkdir()
    (capability_dir / "CAPABILITY.yaml").write_text(MINIMAL, encoding="utf-8")
    (capability_dir / "SKILL.md").symlink_to(tmp_path / "secret.txt")

    with pytest.raises(ManifestError):
        load_manifest(capability_dir / "CAPABILITY.yaml")
