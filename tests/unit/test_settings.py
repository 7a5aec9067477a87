"""Settings: defaults, settings file, CAPDISC_* variables, per-call discovery overrides; the
client settings read without pydantic agree with them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from capdisc import rawsettings
from capdisc.discovery.config import DiscoveryConfig
from capdisc.durations import MAX_SECONDS, duration_problem
from capdisc.errors import ConfigError
from capdisc.rawsettings import OTHER_VARIABLES, SETTING_NAMES, ClientSettings, celery_broker_url
from capdisc.settings import Settings
from capdisc_producers.access import command_settings


def write_settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "capdisc.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tier0_budget_tokens", 200),
        ("tier1_budget_tokens", 800),
        ("tier2_budget_tokens", 2000),
        ("tier1_top_k", 5),
        ("tier2_top_k", 2),
        ("tier1_min_relevance", 0.2),  # calibrated relevance, not a raw cosine of 0.3
        ("use_graph_reranking", False),  # measured: no gain on the benchmark data
        ("graph_boost_factor", 0.15),
        ("collection_name", "capability_index"),
    ],
)
def test_discovery_defaults_are_seed_001_or_measured(field: str, value: Any) -> None:
    assert getattr(Settings.load(environ={}).discovery, field) == value


def test_process_defaults_without_file_or_environment() -> None:
    settings = Settings.load(environ={})

    assert (
        settings.redis_url,
        settings.tenant,
        settings.embedder,
        settings.manifest_max_bytes,
        settings.event_max_bytes,
    ) == ("redis://127.0.0.1:6379/0", "default", "minilm", 65536, 1048576)


@pytest.mark.parametrize(
    ("variable", "raw", "attribute", "expected"),
    [
        ("CAPDISC_TIER1_TOP_K", "9", "discovery.tier1_top_k", 9),
        ("CAPDISC_TIER1_MIN_RELEVANCE", "0.55", "discovery.tier1_min_relevance", 0.55),
        ("CAPDISC_USE_GRAPH_RERANKING", "false", "discovery.use_graph_reranking", False),
        ("CAPDISC_EMBEDDER", "hashing", "embedder", "hashing"),
        ("CAPDISC_HASHING_DIM", "64", "hashing_dim", 64),
        ("CAPDISC_TENANT", "acme", "tenant", "acme"),
    ],
)
def test_environment_variable_overrides_the_default(
    variable: str, raw: str, attribute: str, expected: Any
) -> None:
    value: Any = Settings.load(environ={variable: raw})
    for part in attribute.split("."):
        value = getattr(value, part)

    assert value == expected


def test_variables_without_the_prefix_are_ignored() -> None:
    assert Settings.load(environ={"TIER1_TOP_K": "9", "EMBEDDER": "hashing"}) == Settings.load(
        environ={}
    )


@pytest.fixture
def unknown_reports(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The warnings of unknown ``CAPDISC_*`` variables logged, as if the process had just
    started (none reported yet)."""
    rawsettings._unknown_reported.clear()
    caplog.set_level(logging.WARNING, logger="capdisc.settings")
    yield
    rawsettings._unknown_reported.clear()


def _reported(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "capdisc.settings"]


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("CAPDISC_REDIS_URLL", "CAPDISC_REDIS_URL"),
        ("CAPDISC_DISCOVERY_TIMEOUT", "CAPDISC_DISCOVER_TIMEOUT_S"),
        ("CAPDISC_TIER1_TOPK", "CAPDISC_TIER1_TOP_K"),
    ],
)
@pytest.mark.parametrize("load", [Settings.load, ClientSettings.load])
def test_a_misspelt_variable_is_reported_once_with_the_variable_meant(
    unknown_reports: None,
    caplog: pytest.LogCaptureFixture,
    load: Any,
    variable: str,
    meant: str,
) -> None:
    environ = {variable: "redis://127.0.0.1:6390/0"}

    first = load(environ=environ)
    load(environ=environ)

    assert first is not None  # the process still starts, with the default
    (message,) = _reported(caplog)
    assert variable in message and f"did you mean {meant}?" in message
    assert "ignored" in message


def test_settings_and_variables_read_elsewhere_are_not_reported(
    unknown_reports: None, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {
        **{f"CAPDISC_{name.upper()}": "x" for name in ("tenant", "stack", "token")},
        **dict.fromkeys(OTHER_VARIABLES - {"CAPDISC_SETTINGS_FILE"}, "x"),
        "CAPDISC_TIER1_TOP_K": "3",
    }

    Settings.load(environ=environ)
    ClientSettings.load(environ=environ)

    assert _reported(caplog) == []


def test_the_setting_names_known_without_pydantic_are_those_of_settings() -> None:
    names = {n for n in Settings.model_fields if n not in ("discovery", "sessions")}

    assert set(SETTING_NAMES) == names | set(DiscoveryConfig.model_fields)


def test_settings_file_overrides_the_defaults(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "embedder: hashing\ndiscovery:\n  tier1_top_k: 7\n")

    settings = Settings.load(environ={}, path=path)

    assert (settings.embedder, settings.discovery.tier1_top_k) == ("hashing", 7)


def test_environment_wins_over_the_settings_file(tmp_path: Path) -> None:
    path = write_settings(
        tmp_path, "tenant: from-file\ndiscovery:\n  tier1_top_k: 7\n  tier2_top_k: 3\n"
    )

    settings = Settings.load(
        environ={"CAPDISC_TIER1_TOP_K": "9", "CAPDISC_TENANT": "from-env"}, path=path
    )

    assert (settings.tenant, settings.discovery.tier1_top_k, settings.discovery.tier2_top_k) == (
        "from-env",
        9,
        3,
    )


def test_settings_file_is_found_through_its_variable(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "discovery:\n  tier2_top_k: 4\n")

    settings = Settings.load(environ={"CAPDISC_SETTINGS_FILE": str(path)})

    assert settings.discovery.tier2_top_k == 4


def test_explicit_path_wins_over_the_settings_file_variable(tmp_path: Path) -> None:
    chosen = write_settings(tmp_path, "tenant: chosen\n")
    other = tmp_path / "other.yaml"
    other.write_text("tenant: other\n", encoding="utf-8")

    settings = Settings.load(environ={"CAPDISC_SETTINGS_FILE": str(other)}, path=chosen)

    assert settings.tenant == "chosen"


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("CAPDISC_TIER1_TOP_K", "five"),
        ("CAPDISC_TIER1_TOP_K", "101"),
        ("CAPDISC_TIER1_MIN_RELEVANCE", "1.5"),
        ("CAPDISC_EMBEDDER", "bert"),
        ("CAPDISC_HASHING_DIM", "4"),
        ("CAPDISC_DISCOVER_TIMEOUT_S", "0"),
        ("CAPDISC_LOG_LEVEL", "TRACE"),
        ("CAPDISC_REDIS_URL", "localhost:6379"),
    ],
)
def test_malformed_variable_is_a_config_error_naming_it(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(environ={variable: raw})

    name = variable.removeprefix("CAPDISC_").lower()
    assert str(info.value).startswith(f"setting '{name}' (env {variable}): ")


def test_unknown_key_in_the_settings_file_is_a_config_error(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "tenant: acme\nreddis_url: redis://x\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == (
        f"setting 'reddis_url' (settings file {path}): not a known setting; "
        "did you mean 'redis_url'? correct or remove it"
    )


def test_an_endless_discover_timeout_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "discover_timeout_s: .inf\n")

    with pytest.raises(ConfigError, match=r"^setting 'discover_timeout_s' .*finite"):
        Settings.load(environ={}, path=path)


def test_a_dead_letter_budget_below_one_letter_is_a_config_error_naming_it() -> None:
    environ = {
        "CAPDISC_DEADLETTER_PAYLOAD_MAX_BYTES": "65536",
        "CAPDISC_DEADLETTERS_MAX_BYTES": "4096",
    }

    with pytest.raises(ConfigError, match=r"setting 'deadletters_max_bytes'.*at least"):
        Settings.load(environ=environ)


def test_unknown_discovery_key_in_the_settings_file_is_a_config_error(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "discovery:\n  tier1_topk: 3\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == (
        f"setting 'discovery.tier1_topk' (settings file {path}): not a known setting; "
        "did you mean 'tier1_top_k'? correct or remove it"
    )


@pytest.mark.parametrize(
    ("text", "variables", "named"),
    [
        ("hashing_dim: 4\n", {}, "setting 'hashing_dim' (settings file {path}): "),
        (
            "discovery:\n  tier1_top_k: 500\n",
            {},
            "setting 'discovery.tier1_top_k' (settings file {path}): ",
        ),
        (
            "tenant: acme\n",
            {"CAPDISC_HASHING_DIM": "4"},
            "setting 'hashing_dim' (env CAPDISC_HASHING_DIM): ",
        ),
        (
            "tenant: acme\n",
            {"CAPDISC_TIER1_TOP_K": "500"},
            "setting 'tier1_top_k' (env CAPDISC_TIER1_TOP_K): ",
        ),
        (
            "hashing_dim: 64\n",
            {"CAPDISC_HASHING_DIM": "4"},
            "setting 'hashing_dim' (env CAPDISC_HASHING_DIM): ",
        ),
        ("hashing_dim: 4\n", {"CAPDISC_HASHING_DIM": "64"}, None),
    ],
    ids=[
        "file",
        "file discovery",
        "variable",
        "variable discovery",
        "variable wins",
        "variable fixes",
    ],
)
def test_a_malformed_setting_names_where_it_was_set(
    tmp_path: Path, text: str, variables: dict[str, str], named: str | None
) -> None:
    path = write_settings(tmp_path, text)

    if named is None:
        assert Settings.load(environ=variables, path=path).hashing_dim == 64
        return
    with pytest.raises(ConfigError) as info:
        Settings.load(environ=variables, path=path)

    assert str(info.value).startswith(named.format(path=path))


def test_an_unknown_profile_key_says_which_one_was_meant(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "sessions:\n  profiles:\n    billing:\n      alowlist: [x]\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == (
        f"setting 'sessions.profiles.billing.alowlist' (settings file {path}): "
        "not a known setting; did you mean 'allowlist'? correct or remove it"
    )


@pytest.mark.parametrize("name", ["capdisc.yaml", "redis.password"])
def test_a_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"tenant: caf\xe9\n")
    variables = {"CAPDISC_REDIS_PASSWORD_FILE": str(path)} if name == "redis.password" else {}

    with pytest.raises(ConfigError) as info:
        Settings.load(environ=variables, path=None if variables else path)

    assert f"{path} is not UTF-8 text (byte 11 is not)" in str(info.value)


def test_settings_file_that_is_not_a_mapping_is_a_config_error(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "- tenant: acme\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == (
        f"settings file {path}: must be a YAML mapping of fields, but it is a list"
    )


def test_settings_file_with_duplicate_keys_is_a_config_error(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "tenant: a\ntenant: b\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == (
        f"settings file {path}: field 'tenant': line 2: duplicate key (it appears more than once)"
    )


def test_missing_settings_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value) == f"settings file {path} cannot be read: No such file or directory"


def test_settings_are_frozen() -> None:
    settings = Settings.load(environ={})

    with pytest.raises(ValueError, match="frozen"):
        settings.tenant = "other"  # type: ignore[misc]


# -- DiscoveryConfig.merged ----------------------------------------------------------------------


def test_merged_applies_per_call_overrides() -> None:
    merged = DiscoveryConfig().merged({"tier1_top_k": 3, "use_graph_reranking": False})

    assert (merged.tier1_top_k, merged.use_graph_reranking, merged.tier2_top_k) == (3, False, 2)


def test_merged_leaves_the_base_config_alone() -> None:
    base = DiscoveryConfig()

    base.merged({"tier1_top_k": 3})

    assert base.tier1_top_k == 5


@pytest.mark.parametrize("overrides", [None, {}])
def test_merged_without_overrides_is_the_same_config(overrides: dict[str, Any] | None) -> None:
    base = DiscoveryConfig()

    assert base.merged(overrides) is base


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"tier1_top_k": 500},
            "discovery option 'tier1_top_k': Input should be less than or equal to 100",
        ),
        (
            {"tier1_min_relevance": "high"},
            "discovery option 'tier1_min_relevance': "
            "Input should be a valid number, unable to parse string as a number",
        ),
        (
            {"tier1_topk": 3},
            "discovery option 'tier1_topk': not a known discovery option; "
            "did you mean 'tier1_top_k'? correct or remove it",
        ),
    ],
)
def test_merged_with_an_invalid_override_is_a_config_error(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        DiscoveryConfig().merged(overrides)

    assert str(info.value) == message


def test_redis_password_file_goes_into_the_url_and_repr_masks_it(tmp_path: Path) -> None:
    secret = tmp_path / "redis.password"
    secret.write_text("hunter2-very-secret\n")

    settings = Settings.load(
        environ={
            "CAPDISC_REDIS_URL": "redis://127.0.0.1:7000/0",
            "CAPDISC_REDIS_PASSWORD_FILE": str(secret),
            "CAPDISC_AUTH": "on",
        }
    )

    assert settings.redis_url == "redis://:hunter2-very-secret@127.0.0.1:7000/0"
    assert settings.auth is True
    assert "hunter2" not in repr(settings) and "redis://:***@127.0.0.1:7000/0" in repr(settings)
    with pytest.raises(ConfigError, match="redis_password_file"):
        Settings.load(environ={"CAPDISC_REDIS_PASSWORD_FILE": str(tmp_path / "absent")})


# -- ClientSettings: the same fields, read without pydantic --------------------------------------


def test_client_settings_are_fields_of_settings_with_their_types_and_defaults() -> None:
    hints = get_type_hints(ClientSettings)
    for field in dataclasses.fields(ClientSettings):
        assert field.name in Settings.model_fields, field.name
        model_field = Settings.model_fields[field.name]
        assert (hints[field.name], field.default) == (model_field.annotation, model_field.default)


#: (variables, settings file or None, whether ClientSettings.load reads them itself). The
#: others it leaves to Settings (None); every case must end with what Settings says.
CLIENT_CASES: list[tuple[dict[str, str], str | None, bool]] = [
    ({}, None, True),
    (
        {
            "CAPDISC_REDIS_URL": "redis://10.0.0.7:6380/2",
            "CAPDISC_TENANT": "Acme_2",
            "CAPDISC_AUTH_KEYS_FILE": "/etc/capdisc/keys.json",
            "CAPDISC_DISCOVER_TIMEOUT_S": "12.5",
        },
        None,
        True,
    ),
    *(({"CAPDISC_AUTH": raw}, None, True) for raw in ("true", "TRUE", "1", "yes", "On", "t", "Y")),
    *(({"CAPDISC_AUTH": raw}, None, True) for raw in ("false", "False", "0", "no", "OFF", "f")),
    *(({"CAPDISC_DISCOVER_TIMEOUT_S": raw}, None, True) for raw in ("5", "0.25", ".5", "7.")),
    ({"CAPDISC_AUTH_KEYS_FILE": ""}, None, True),
    ({"CAPDISC_REDIS_URL": ""}, None, True),
    (
        {},
        "redis_url: redis://h:6379/1\ntenant: from-file\nauth: false\n"
        "auth_keys_file: null\ndiscover_timeout_s: 3\nembedder: hashing\n",
        True,
    ),
    ({}, "discover_timeout_s: 0.5\nauth: yes\n", True),
    ({"CAPDISC_TENANT": "from-env"}, "tenant: from-file\n", True),
    # values in other forms, or wrong: Settings reads them, or says what is wrong
    ({"CAPDISC_AUTH": ""}, None, False),
    ({"CAPDISC_AUTH": " true"}, None, False),
    ({"CAPDISC_AUTH": "maybe"}, None, False),
    ({"CAPDISC_TENANT": "a b"}, None, False),
    ({"CAPDISC_TENANT": ""}, None, False),
    *(
        ({"CAPDISC_DISCOVER_TIMEOUT_S": raw}, None, False)
        for raw in ("1e3", "inf", "nan", " 5", "+5", "1_000", "0", "0.0", "-1", "five", "٣")
    ),
    ({}, "tenant: 5\n", False),
    ({}, "auth: 1\n", False),
    ({}, "redis_url: 6379\n", False),
    ({"CAPDISC_REDIS_URL": "localhost:6379"}, None, False),
    ({}, "discover_timeout_s: true\n", False),
    ({}, "discover_timeout_s: .nan\n", False),
    ({}, "discover_timeout_s: .inf\n", False),
    ({}, "auth_keys_file: 3\n", False),
]


@pytest.mark.parametrize(("variables", "file_text", "plain"), CLIENT_CASES)
def test_client_settings_agree_with_settings(
    tmp_path: Path, variables: dict[str, str], file_text: str | None, plain: bool
) -> None:
    path = write_settings(tmp_path, file_text) if file_text is not None else None
    try:
        expected: ClientSettings | str = Settings.load(variables, path).client_settings()
    except ConfigError as exc:
        expected = str(exc)

    light = ClientSettings.load(variables, path)
    try:
        resolved: ClientSettings | str = command_settings(path, variables)
    except ConfigError as exc:
        resolved = str(exc)

    assert (light is not None) == plain
    assert resolved == expected
    if light is not None:
        assert light == expected


def test_client_settings_neither_read_nor_check_the_other_settings(tmp_path: Path) -> None:
    """What ``capdisc discover`` gives up for its start-up: a malformed setting it does not use
    is reported by the commands that use it, not by discover."""
    path = write_settings(tmp_path, "hashing_dim: 4\nreddis_url: redis://x\n")
    variables = {"CAPDISC_EMBEDDER": "bert"}

    assert ClientSettings.load(variables, path) == ClientSettings()
    with pytest.raises(ConfigError):
        Settings.load(variables, path)


def test_client_settings_put_the_password_file_into_the_url_as_settings_do(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "redis.password"
    secret.write_text("hunter2\n")
    named = {"CAPDISC_REDIS_URL": "redis://h:7000/0", "CAPDISC_REDIS_PASSWORD_FILE": str(secret)}
    own = {**named, "CAPDISC_REDIS_URL": "redis://:mine@h:7000/0"}
    absent = {"CAPDISC_REDIS_PASSWORD_FILE": str(tmp_path / "absent")}

    for variables in (named, own):
        light = ClientSettings.load(variables)
        assert light == Settings.load(variables).client_settings()
    assert ClientSettings.load(named) == ClientSettings(
        redis_url="redis://:hunter2@h:7000/0", redis_password_file=secret
    )
    with pytest.raises(ConfigError) as light_error:
        ClientSettings.load(absent)
    with pytest.raises(ConfigError) as error:
        Settings.load(absent)
    assert str(light_error.value) == str(error.value)


@pytest.mark.parametrize(
    "file_text", ["- tenant: acme\n", "tenant: a\ntenant: b\n", "tenant: [unclosed\n"]
)
def test_client_settings_refuse_a_bad_settings_file_as_settings_do(
    tmp_path: Path, file_text: str
) -> None:
    path = write_settings(tmp_path, file_text)

    with pytest.raises(ConfigError) as light_error:
        ClientSettings.load({}, path)
    with pytest.raises(ConfigError) as error:
        Settings.load({}, path)
    assert str(light_error.value) == str(error.value)


def test_client_settings_find_the_settings_file_through_its_variable(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "tenant: chosen\n")

    assert ClientSettings.load({"CAPDISC_SETTINGS_FILE": str(path)}) == ClientSettings(
        tenant="chosen"
    )


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://:pw@host:6380/1", "unix:///run/redis.sock"]
)
def test_each_redis_url_scheme_redis_py_connects_with_is_accepted(url: str) -> None:
    assert Settings.load(environ={"CAPDISC_REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize(
    ("url", "broker"),
    [
        ("redis://:pw@127.0.0.1:6379/2", "redis://:pw@127.0.0.1:6379/2"),
        ("rediss://host:6380/1", "rediss://host:6380/1"),
        ("unix:///run/redis.sock", "redis+socket:///run/redis.sock?virtual_host=0"),
        ("unix://:p%40ss@/run/r.sock?db=3", "redis+socket://:p%40ss@/run/r.sock?virtual_host=3"),
        (
            "unix:///run/r.sock?db=1&password=p@ss",
            "redis+socket://:p%40ss@/run/r.sock?virtual_host=1",
        ),
        ("unix://ops:pw@/run/r.sock", "redis+socket://ops:pw@/run/r.sock?virtual_host=0"),
    ],
)
def test_a_unix_socket_url_is_given_to_celery_in_kombus_form(url: str, broker: str) -> None:
    assert celery_broker_url(url) == broker


def test_a_malformed_redis_url_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(environ={"CAPDISC_REDIS_URL": "http://:s3cret@host:6379/0"})

    assert "s3cret" not in str(info.value) and "redis://HOST:PORT/DB" in str(info.value)


def test_a_nested_setting_is_named_as_in_the_settings_file_not_as_a_variable(
    tmp_path: Path,
) -> None:
    path = write_settings(tmp_path, "sessions:\n  profiles:\n    billing:\n      allowlist: x\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value).startswith(
        f"setting 'sessions.profiles.billing.allowlist' (settings file {path}): "
    )


# -- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "refused"),
    [
        ("heartbeat_interval_s", 2.0, False),
        ("reconcile_interval_s", 0.0, False),
        ("snapshot_interval_s", float(MAX_SECONDS), False),
        ("claim_idle_ms", MAX_SECONDS * 1000, False),
        ("heartbeat_interval_s", float("inf"), True),
        ("sweep_interval_s", float("nan"), True),
        ("reconcile_interval_s", 1e300, True),
        ("reply_ttl_s", MAX_SECONDS + 1, True),
        ("claim_idle_ms", MAX_SECONDS * 1000 + 1, True),
        ("hashing_dim", 10**30, False),  # not a duration: its own bounds apply
        ("heartbeat_interval_s", "soon", False),  # not a number: its type says so
    ],
)
def test_a_duration_is_finite_and_at_most_a_year(name: str, value: Any, refused: bool) -> None:
    assert (duration_problem(name, value) is not None) is refused


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("CAPDISC_HEARTBEAT_INTERVAL_S", "inf"),
        ("CAPDISC_RECONCILE_INTERVAL_S", "1e300"),
        ("CAPDISC_SWEEP_INTERVAL_S", "infinity"),
        ("CAPDISC_OPENAI_TIMEOUT_S", "inf"),
        ("CAPDISC_REPLY_TTL_S", "100000000000000000000"),
        ("CAPDISC_CLAIM_IDLE_MS", "100000000000000000000"),
    ],
)
def test_an_endless_duration_setting_is_a_config_error_naming_it(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(environ={variable: raw})

    name = variable.removeprefix("CAPDISC_").lower()
    assert str(info.value).startswith(f"setting '{name}' (env {variable}): ")
    assert "must be a finite number of at most" in str(info.value)


def test_an_endless_session_duration_is_a_config_error_naming_its_key(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "sessions:\n  max_age_s: .inf\n")

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value).startswith(f"setting 'sessions.max_age_s' (settings file {path}): ")


@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({}, False),
        ({"CAPDISC_HEARTBEAT_INTERVAL_S": "5"}, False),
        ({"CAPDISC_HEARTBEAT_INTERVAL_S": "30"}, True),
        ({"CAPDISC_HEARTBEAT_INTERVAL_S": "30", "CAPDISC_WORKER_STALE_AFTER_S": "60"}, False),
        ({"CAPDISC_WORKER_STALE_AFTER_S": "3"}, True),
    ],
)
def test_workers_are_not_taken_for_gone_between_their_heartbeats(
    variables: dict[str, str], refused: bool
) -> None:
    if not refused:
        Settings.load(environ=variables)
        return
    with pytest.raises(ConfigError, match=r"^setting 'worker_stale_after_s' .*at least twice"):
        Settings.load(environ=variables)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ("tier1_topk: 3", "discovery option 'tier1_topk': not a known discovery option; did you"),
        ("tier1_top_k: 500", "discovery option 'tier1_top_k': Input should be less than or equal"),
    ],
)
def test_an_agent_profile_with_a_bad_discovery_option_is_refused_at_load(
    tmp_path: Path, options: str, problem: str
) -> None:
    text = f"sessions:\n  profiles:\n    billing:\n      options:\n        {options}\n"
    path = write_settings(tmp_path, text)

    with pytest.raises(ConfigError) as info:
        Settings.load(environ={}, path=path)

    assert str(info.value).startswith(
        f"setting 'sessions' (settings file {path}): Value error, agent profile 'billing', "
        f"options: {problem}"
    )


def test_an_agent_profiles_valid_discovery_options_load() -> None:
    profiles = {"billing": {"options": {"tier1_top_k": 3, "fusion": "rrf"}}}

    settings = Settings.model_validate({"sessions": {"profiles": profiles}})

    assert settings.sessions.profile("billing").options == {"tier1_top_k": 3, "fusion": "rrf"}


@pytest.mark.parametrize(
    "url",
    [
        "redis://:Zq@Zq/Zq#Zq@127.0.0.1:6379/0",
        "redis://:Zq/Zq@127.0.0.1:6379/0",
        "redis://user:Zq?Zq@127.0.0.1:6379/0",
        "rediss://:Zq#Zq@redis.example:6380/0",
    ],
)
def test_a_redis_password_that_ends_early_is_refused_without_showing_any_of_it(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(environ={"CAPDISC_REDIS_URL": url})

    message = str(info.value)
    assert message.startswith("setting 'redis_url' (env CAPDISC_REDIS_URL): ")
    assert "percent-encode them (%23, %2F, %3F, %40)" in message
    assert "Zq" not in message


@pytest.mark.parametrize(
    "url",
    ["redis://:pa%2Fss%23x%40y@127.0.0.1:6379/0", "unix://:pw@/run/redis.sock?db=1", ""],
)
def test_a_redis_url_with_an_encoded_password_or_a_socket_is_accepted(url: str) -> None:
    assert Settings.load(environ={"CAPDISC_REDIS_URL": url}).redis_url == url


def test_a_command_option_checked_as_the_settings_are_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^setting 'redis_url': .*percent-encode"):
        Settings.load(environ={}).with_changes(redis_url="redis://:a/b@127.0.0.1:6379/0")
