"""CAPABILITY.yaml parsing: the bad-manifest corpus, valid manifests, and directory scans."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from capdisc.errors import ManifestError
from capdisc.models import Relationship, SourceRef
from capdisc.registry.manifest import (
    DEFAULT_MAX_BYTES,
    MANIFEST_NAME,
    ScanCache,
    load_manifest,
    parse_manifest_text,
    scan_directory,
)

BAD = Path(__file__).resolve().parent.parent / "fixtures" / "bad_manifests"
MINIMAL = "name: web-search\nkind: tool\ndescription: Searches the public web.\n"

# (case directory, field the error names or None for the document as a whole, part of the message)
BAD_CASES = [
    ("missing_name", "name", "is required"),
    ("missing_kind", "kind", "is required"),
    ("missing_description", "description", "is required"),
    ("unknown_kind", "kind", "must be one of tool, skill, extension, channel, got 'plugin'"),
    ("unknown_field_typo", "descripton", "unknown field (known fields: "),
    ("duplicate_key", "name", "line 3: duplicate key"),
    ("yaml_anchor_alias", None, "line 3: YAML anchors (&name) are not allowed"),
    ("yaml_merge_key", None, "line 4: YAML merge keys (<<) are not allowed"),
    ("two_documents", None, "must hold exactly one YAML document"),
    (
        "python_tag",
        None,
        "line 3: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'",
    ),
    ("top_level_list", None, "must be a YAML mapping of fields, but it is a list"),
    ("empty_file", None, "must be a YAML mapping of fields, but it is empty"),
    ("version_unquoted_number", "version", "must be a string, got a number (quote it)"),
    ("description_boolean_no", "description", "must be a string, got a boolean (quote it)"),
    ("description_only_whitespace", "description", "must not be empty"),
    ("available_string", "available", "must be true or false, got a string"),
    ("tags_not_a_list", "tags", "must be a list of strings, got a string"),
    ("tag_invalid_identifier", "tags[1]", "'web search!' is not a valid name"),
    ("name_with_spaces", "name", "'web search' is not a valid name"),
    ("id_wrong_form", "id", "'web-search' is not a valid id (form 'kind:name'"),
    (
        "zero_width_in_description",
        "description",
        "invisible or control character U+200B at position 24",
    ),
    ("bidi_override_in_name", "name", "invisible or control character U+202E at position 10"),
    (
        "control_char_escape_in_description",
        "description",
        "invisible or control character U+001B at position 17",
    ),
    ("nul_byte", None, "contains a NUL byte"),
    (
        "integer_too_long",
        None,
        "line 7: '99999999999999999999...' cannot be read as a number or date",
    ),
    (
        "integer_too_long_hex",
        None,
        "line 7: '0xffffffffffffffffff...' cannot be read as a number or date",
    ),
    ("date_out_of_range", None, "line 4: '2024-13-45' cannot be read as a number or date"),
    ("invalid_utf8", None, "is not valid UTF-8 (byte 54)"),
    ("deep_nesting_parameters", None, "line 36: nested deeper than 32 levels"),
    # The manifest says `parameters`; the error names the record field it maps to.
    ("parameters_not_object", "parameters", "the top-level schema must have type 'object'"),
    ("schema_json_is_a_list", None, "must be a JSON Schema object, got a list"),
    ("parameters_and_schema_json", "parameters", "is set and schema.json exists beside it"),
    (
        "broken_schema_json",
        None,
        "is not valid JSON (line 5: Expecting property name enclosed in double quotes)",
    ),
    ("schema_json_nested_too_deeply", None, "is nested too deeply to read"),
    ("schema_json_number_too_long", None, "holds a number too long to read"),
    ("nan_schema_default", "parameters.properties.limit.default", "must be a finite number"),
    ("inf_schema_json_default", "properties.limit.default", "must be a finite number"),
    ("full_schema_key", "full_schema", "unknown field"),
    ("alias_sets_field_twice", "displayName", "sets 'display_name' a second time"),
    ("examples_not_a_list", "examples", "must be a list of mappings with a description"),
    (
        "skill_content_path_traversal",
        "skill_content",
        "'../../etc/passwd' points outside the capability directory",
    ),
    ("skill_content_missing_file", "skill_content", "'docs/SKILL.md' does not exist"),
    (
        "relationship_unknown_type",
        "relationships[0].type",
        "must be one of related, composed_with, depends_on, got 'extends'",
    ),
    (
        "relationship_bad_target",
        "relationships[0].target[0]",
        "'web fetch' is not a capability id or name",
    ),
    (
        "required_secret_invalid_name",
        "required_secrets[0]",
        "'search-api-key' is not a valid secret name",
    ),
    (
        "invisible_character_in_skill_md",
        None,
        "invisible or control character U+200B at position 59 (line 4, column 15)",
    ),
]
# Cases whose error names a side file rather than CAPABILITY.yaml.
FILE_AT_FAULT = {
    "broken_schema_json": "schema.json",
    "schema_json_is_a_list": "schema.json",
    "inf_schema_json_default": "schema.json",
    "schema_json_nested_too_deeply": "schema.json",
    "schema_json_number_too_long": "schema.json",
    "invisible_character_in_skill_md": "SKILL.md",
}


def write_capability(
    directory: Path, manifest: str, side_files: dict[str, str] | None = None
) -> Path:
    """Write CAPABILITY.yaml and ``side_files`` (name -> text) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST_NAME
    path.write_text(manifest, encoding="utf-8")
    for name, text in (side_files or {}).items():
        (directory / name).write_text(text, encoding="utf-8")
    return path


# -- the bad-manifest corpus ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case_dir", "field", "message"), BAD_CASES, ids=[case[0] for case in BAD_CASES]
)
def test_bad_manifest_is_rejected_naming_file_and_field(
    case_dir: str, field: str | None, message: str
) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(BAD / case_dir / MANIFEST_NAME)

    error = info.value
    source = BAD / case_dir / FILE_AT_FAULT.get(case_dir, MANIFEST_NAME)
    prefix = f"{source}: field '{field}': " if field else f"{source}: "
    assert str(error).startswith(prefix)
    assert error.field == field
    assert message in error.problem


def test_every_bad_manifest_case_has_an_expected_error() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.is_dir()}

    assert on_disk == {case[0] for case in BAD_CASES}


def test_scanning_the_bad_corpus_accepts_nothing() -> None:
    result = scan_directory(BAD)

    assert result.capabilities == {}
    assert len(result.errors) == len(BAD_CASES)


def test_oversize_manifest_is_rejected_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / MANIFEST_NAME
    # Not even YAML: the size check must come first.
    path.write_bytes(b"\x00" * (DEFAULT_MAX_BYTES + 1))

    with pytest.raises(ManifestError) as info:
        load_manifest(path)

    assert str(info.value) == (
        f"{path}: is 65537 bytes, the limit is 65536; shorten it or move long text to SKILL.md"
    )


def test_manifest_of_exactly_the_size_limit_is_accepted(tmp_path: Path) -> None:
    padding = "# " + "x" * (DEFAULT_MAX_BYTES - len(MINIMAL) - 3) + "\n"
    path = write_capability(tmp_path, MINIMAL + padding)
    assert path.stat().st_size == DEFAULT_MAX_BYTES

    assert load_manifest(path).id == "tool:web-search"


def test_scan_applies_its_max_bytes_to_every_manifest(tmp_path: Path) -> None:
    path = write_capability(tmp_path / "web-search", MINIMAL)

    result = scan_directory(tmp_path, max_bytes=len(MINIMAL) - 1)

    assert result.capabilities == {}
    assert result.errors[path].problem.startswith(f"is {len(MINIMAL)} bytes, the limit is ")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize("make", [_fifo, _device, _directory])
def test_a_manifest_that_is_no_regular_file_is_refused_without_reading_it(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    good = write_capability(tmp_path / "web-search", MINIMAL)
    (tmp_path / "odd").mkdir()
    odd = tmp_path / "odd" / MANIFEST_NAME
    make(odd)

    result = scan_directory(tmp_path)  # a pipe or /dev/zero read would never end

    assert result.errors[odd].problem.startswith("is not a regular file")
    assert [c.id for c in result.capabilities.values()] == ["tool:web-search"]
    assert good not in result.errors


def _symlink_loop(path: Path) -> None:
    path.symlink_to(path.name)


def _dangling_symlink(path: Path) -> None:
    path.symlink_to(path.parent / "moved.yaml")


@pytest.mark.parametrize("make", [_symlink_loop, _dangling_symlink])
def test_a_manifest_that_is_a_broken_symlink_is_refused_not_skipped(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    (tmp_path / "odd").mkdir()
    odd = tmp_path / "odd" / MANIFEST_NAME
    make(odd)

    result = scan_directory(tmp_path)  # skipped, the capability it defined would be deleted

    assert result.errors[odd].problem.startswith("cannot be read: ")


def test_unknown_field_error_lists_the_manifest_spelling_parameters() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest_text(MINIMAL + "colour: red\n", "m.yaml")

    assert info.value.field == "colour"
    assert info.value.problem.endswith(", parameters)")


# -- a valid manifest ----------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
}
SKILL_MD = "# Web search\n\nUse it for current facts.\n"


@pytest.fixture
def full_manifest(tmp_path: Path) -> Path:
    return write_capability(
        tmp_path / "web" / "web-search",
        MINIMAL,
        {"SKILL.md": SKILL_MD, "schema.json": json.dumps(SCHEMA)},
    )


def test_skill_md_beside_the_manifest_becomes_full_content(full_manifest: Path) -> None:
    assert load_manifest(full_manifest).full_content == SKILL_MD


def test_schema_json_beside_the_manifest_becomes_full_schema(full_manifest: Path) -> None:
    capability = load_manifest(full_manifest)

    assert capability.full_schema == SCHEMA
    assert capability.parameter_names == ("query", "limit")


def test_id_defaults_to_kind_colon_name(full_manifest: Path) -> None:
    assert load_manifest(full_manifest).id == "tool:web-search"


def test_explicit_id_is_kept() -> None:
    capability = parse_manifest_text("id: tool:search/web\n" + MINIMAL, "m.yaml")

    assert capability.id == "tool:search/web"


def test_display_name_is_derived_from_the_name(full_manifest: Path) -> None:
    assert load_manifest(full_manifest).display_name == "Web Search"


def test_category_defaults_to_general() -> None:
    assert parse_manifest_text(MINIMAL, "m.yaml").category == "general"


def test_source_ref_names_the_registry_root_and_the_manifest(
    tmp_path: Path, full_manifest: Path
) -> None:
    capability = load_manifest(full_manifest, registry_root=tmp_path)

    assert capability.source_ref == SourceRef(
        type="manifest", source=str(tmp_path), location=str(full_manifest)
    )


def test_without_registry_root_the_source_is_the_manifest_directory(full_manifest: Path) -> None:
    assert load_manifest(full_manifest).source_ref.source == str(full_manifest.parent)


def test_manifest_without_side_files_has_no_content_or_schema(tmp_path: Path) -> None:
    capability = load_manifest(write_capability(tmp_path, MINIMAL))

    assert (capability.full_content, capability.full_schema) == (None, None)


@pytest.mark.parametrize(
    ("line", "attribute", "expected"),
    [
        ("displayName: Search The Web", "display_name", "Search The Web"),
        ("requiredSecrets: [SEARCH_API_KEY]", "required_secrets", ("SEARCH_API_KEY",)),
        ("requiredTools: [tool:web-fetch]", "required_tools", ("tool:web-fetch",)),
        ("hasSideEffects: true", "has_side_effects", True),
        ("exampleQueries: [latest news]", "example_queries", ("latest news",)),
        ("inputSchema: {type: object}", "full_schema", {"type": "object"}),
        ("input_schema: {type: object}", "full_schema", {"type": "object"}),
        ("parameters: {type: object}", "full_schema", {"type": "object"}),
    ],
)
def test_alias_spelling_sets_the_record_field(line: str, attribute: str, expected: object) -> None:
    capability = parse_manifest_text(MINIMAL + line + "\n", "m.yaml")

    assert getattr(capability, attribute) == expected


def test_skill_content_alias_reads_the_named_file(tmp_path: Path) -> None:
    path = write_capability(tmp_path, MINIMAL + "skillContent: docs/guide.md\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("guide text\n", encoding="utf-8")

    assert load_manifest(path).full_content == "guide text\n"


def test_examples_descriptions_become_example_queries() -> None:
    text = MINIMAL + (
        "examples:\n  - description: Search for the latest Python release\n"
        "    input: {query: python release}\n  - description: Who won the match\n"
    )

    capability = parse_manifest_text(text, "m.yaml")

    assert capability.example_queries == (
        "Search for the latest Python release",
        "Who won the match",
    )


def test_examples_are_appended_after_example_queries() -> None:
    text = MINIMAL + "example_queries: [first]\nexamples:\n  - second\n  - description: third\n"

    assert parse_manifest_text(text, "m.yaml").example_queries == ("first", "second", "third")


def test_example_without_description_string_is_rejected_with_its_index() -> None:
    text = MINIMAL + "examples:\n  - description: fine\n  - input: {query: x}\n"

    with pytest.raises(ManifestError) as info:
        parse_manifest_text(text, "m.yaml")

    assert info.value.field == "examples[1]"


def test_relationships_accept_strings_and_mappings() -> None:
    text = MINIMAL + (
        "relationships:\n  - tool:news-search\n  - {target: tool:web-fetch, type: composed_with}\n"
    )

    assert parse_manifest_text(text, "m.yaml").relationships == (
        Relationship(target="tool:news-search", type="related"),
        Relationship(target="tool:web-fetch", type="composed_with"),
    )


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / MANIFEST_NAME
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())

    assert load_manifest(path).name == "web-search"


def test_parse_manifest_text_has_no_source_directory() -> None:
    capability = parse_manifest_text(MINIMAL, "upload.yaml")

    assert capability.source_ref == SourceRef(type="manifest", source="", location="upload.yaml")


def test_parse_manifest_text_errors_name_the_given_source() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest_text("kind: tool\ndescription: x\n", "upload.yaml")

    assert str(info.value) == "upload.yaml: field 'name': is required"


# -- directory scans -----------------------------------------------------------------------------


def test_scan_finds_manifests_in_nested_directories(tmp_path: Path) -> None:
    first = write_capability(tmp_path / "web" / "web-search", MINIMAL)
    second = write_capability(
        tmp_path / "dev" / "git" / "git-cli", "name: git-cli\nkind: tool\ndescription: Runs git.\n"
    )

    result = scan_directory(tmp_path)

    assert {path: cap.id for path, cap in result.capabilities.items()} == {
        first: "tool:web-search",
        second: "tool:git-cli",
    }
    assert result.errors == {}


def test_duplicate_id_is_an_error_on_the_second_file_and_the_first_is_kept(tmp_path: Path) -> None:
    first = write_capability(tmp_path / "a", MINIMAL)
    second = write_capability(tmp_path / "b", MINIMAL.replace("Searches", "Also searches"))

    result = scan_directory(tmp_path)

    assert list(result.capabilities) == [first]
    assert list(result.errors) == [second]
    assert str(result.errors[second]) == (
        f"{second}: field 'id': 'tool:web-search' is already defined by {first}"
    )


WEB = "tool:web-search"
BROKEN = "name: web-search\nkind: tool\ndescription: [unclosed\n"

# files (directory -> "v1"/"v2" description, or BROKEN); held (the file the registry holds
# tool:web-search from, or None); expected: the file that keeps the id (or None), and for each
# rejected duplicate, the file its error names and whether it says the keeper fails to parse
DUPLICATE_CASES = [
    pytest.param({"a": "v1", "b": "v2"}, None, "a", {"b": ("a", False)}, id="first-in-path-order"),
    pytest.param({"a": "v1", "b": "v2"}, "a", "a", {"b": ("a", False)}, id="held-and-first"),
    pytest.param(
        {"a": "v1", "b": "v2"}, "b", "b", {"a": ("b", False)}, id="held-wins-over-an-earlier-path"
    ),
    pytest.param(
        {"a": BROKEN, "b": "v2"},
        "a",
        None,
        {"b": ("a", True)},
        id="held-broken-duplicate-still-rejected",
    ),
    pytest.param(
        {"a": BROKEN, "b": "v2", "c": "v3"},
        "a",
        None,
        {"b": ("a", True), "c": ("a", True)},
        id="held-broken-every-duplicate-rejected",
    ),
    pytest.param({"b": "v2"}, "a", "b", {}, id="held-file-gone-the-other-takes-it"),
    pytest.param({"a": BROKEN, "b": "v2"}, None, "b", {}, id="broken-never-held-other-takes-it"),
    pytest.param({"a": "v1"}, None, "a", {}, id="single"),
]


@pytest.mark.parametrize(("files", "held", "keeper", "rejected"), DUPLICATE_CASES)
def test_a_duplicate_id_never_replaces_the_version_the_registry_holds(
    tmp_path: Path,
    files: dict[str, str],
    held: str | None,
    keeper: str | None,
    rejected: dict[str, tuple[str, bool]],
) -> None:
    def path(name: str) -> Path:
        return tmp_path / name / MANIFEST_NAME

    for name, text in files.items():
        write_capability(
            tmp_path / name,
            text
            if text == BROKEN
            else MINIMAL.replace("Searches the public web.", f"Searches, {text}."),
        )

    result = scan_directory(tmp_path, held={WEB: path(held)} if held else None)

    assert {p: c.id for p, c in result.capabilities.items()} == (
        {path(keeper): WEB} if keeper else {}
    )
    duplicates = {p: e for p, e in result.errors.items() if e.field == "id"}
    assert set(duplicates) == {path(name) for name in rejected}
    for name, (named, broken) in rejected.items():
        message = str(duplicates[path(name)])
        assert f"{WEB!r} is already defined by {path(named)}" in message
        assert ("fails to parse" in message) == broken
    assert list(result.errors) == sorted(result.errors)


@pytest.mark.parametrize("hidden", [".git", ".cache/nested"])
def test_hidden_directories_are_skipped(tmp_path: Path, hidden: str) -> None:
    visible = write_capability(tmp_path / "web-search", MINIMAL)
    write_capability(tmp_path / hidden / "broken", "not: [a, manifest")

    result = scan_directory(tmp_path)

    assert list(result.capabilities) == [visible]
    assert result.errors == {}


def test_broken_manifest_is_reported_and_the_others_still_parse(tmp_path: Path) -> None:
    good = write_capability(tmp_path / "good", MINIMAL)
    bad = write_capability(tmp_path / "bad", "name: x\nkind: tool\n")

    result = scan_directory(tmp_path)

    assert list(result.capabilities) == [good]
    assert result.errors[bad].field == "description"


def test_scan_uses_the_resolved_root_as_source(tmp_path: Path) -> None:
    write_capability(tmp_path / "web-search", MINIMAL)

    result = scan_directory(tmp_path / "web-search" / "..")

    assert result.root == tmp_path.resolve()
    [capability] = result.capabilities.values()
    assert capability.source_ref.source == str(tmp_path.resolve())


# -- ScanCache ---------------------------------------------------------------------------------


def _write_capability(directory: Path, description: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "CAPABILITY.yaml"
    path.write_text(f"name: {directory.name}\nkind: tool\ndescription: {description}\n")
    return path


def test_scan_cache_reuses_the_parse_of_an_unchanged_manifest(tmp_path: Path) -> None:
    _write_capability(tmp_path / "alpha", "First text.")
    cache = ScanCache()
    first = scan_directory(tmp_path, cache=cache)

    second = scan_directory(tmp_path, cache=cache)

    assert next(iter(second.capabilities.values())) is next(iter(first.capabilities.values()))


def test_scan_cache_reparses_a_manifest_whose_file_changed(tmp_path: Path) -> None:
    path = _write_capability(tmp_path / "alpha", "First text.")
    cache = ScanCache()
    scan_directory(tmp_path, cache=cache)
    path.write_text(path.read_text().replace("First text.", "Second, longer text."))

    again = scan_directory(tmp_path, cache=cache)

    assert [c.description for c in again.capabilities.values()] == ["Second, longer text."]


def test_scan_cache_reparses_when_a_skill_md_appears_beside_the_manifest(tmp_path: Path) -> None:
    _write_capability(tmp_path / "alpha", "First text.")
    cache = ScanCache()
    scan_directory(tmp_path, cache=cache)
    (tmp_path / "alpha" / "SKILL.md").write_text("# How to use alpha\n")

    again = scan_directory(tmp_path, cache=cache)

    assert [c.full_content for c in again.capabilities.values()] == ["# How to use alpha\n"]


def test_scan_cache_keeps_reporting_an_unchanged_broken_manifest(tmp_path: Path) -> None:
    path = _write_capability(tmp_path / "alpha", "First text.")
    path.write_text(path.read_text() + "kind: skill\n")
    cache = ScanCache()
    scan_directory(tmp_path, cache=cache)

    again = scan_directory(tmp_path, cache=cache)

    assert "duplicate key" in str(again.errors[path])


@pytest.mark.parametrize(
    "reference",
    [r'"a\0b"', r'"\ud800"', '"' + "a" * 5000 + '"'],
    ids=["nul", "lone-surrogate", "name-too-long"],
)
def test_a_skill_content_that_is_no_usable_path_is_refused_naming_the_field(
    tmp_path: Path, reference: str
) -> None:
    manifest = "name: notes\nkind: skill\ndescription: Notes.\nskill_content: " + reference + "\n"
    path = write_capability(tmp_path / "notes", manifest)

    result = scan_directory(tmp_path)  # an exception here stops the watcher and `capdisc up`

    assert result.errors[path].field == "skill_content"


@pytest.mark.parametrize(
    ("side_file", "field"), [("SKILL.md", "skill_content"), ("schema.json", "parameters")]
)
def test_a_side_file_that_is_a_symlink_loop_is_refused_naming_the_field(
    tmp_path: Path, side_file: str, field: str
) -> None:
    path = write_capability(tmp_path / "web-search", MINIMAL)
    (tmp_path / "web-search" / side_file).symlink_to(side_file)

    result = scan_directory(tmp_path)

    assert result.errors[path].field == field


def _side_directory(path: Path) -> None:
    path.mkdir()


def _side_dangling_symlink(path: Path) -> None:
    path.symlink_to("moved")


@pytest.mark.parametrize("side_file", ["SKILL.md", "schema.json"])
@pytest.mark.parametrize("make", [_side_directory, _side_dangling_symlink])
def test_a_side_file_that_cannot_be_read_is_refused_not_left_out(
    tmp_path: Path, side_file: str, make: Callable[[Path], None]
) -> None:
    path = write_capability(tmp_path / "web-search", MINIMAL)
    make(tmp_path / "web-search" / side_file)

    result = scan_directory(tmp_path)  # left out, the stored content or schema would be dropped

    assert path in result.errors
    assert result.capabilities == {}


def test_a_manifest_whose_parsing_fails_unforeseen_is_refused_alone_and_the_scan_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capdisc.registry import manifest

    checked = manifest.capability_from_record

    def gap(record: dict[str, object], source: str) -> object:
        if record.get("name") == "boom":
            raise RuntimeError("a parser gap")
        return checked(record, source)

    monkeypatch.setattr(manifest, "capability_from_record", gap)
    broken = write_capability(tmp_path / "boom", MINIMAL.replace("web-search", "boom"))
    write_capability(tmp_path / "fine", MINIMAL)

    result = scan_directory(tmp_path)

    assert [c.name for c in result.capabilities.values()] == ["web-search"]
    assert "RuntimeError: a parser gap" in str(result.errors[broken])
    assert "this is a capdisc bug" in str(result.errors[broken])
