"""Where settings come from, and the few a command needs to reach the stack, read without pydantic.

Every setting is read here: its default, then the settings file (``--settings`` or
``CAPDISC_SETTINGS_FILE``), then its ``CAPDISC_*`` variable (``CAPDISC_`` and its name in upper
case). :class:`~capdisc.settings.Settings` checks the values it gets from
:func:`settings_file_values` and :func:`environment_values` (pydantic); :class:`ClientSettings`
is the same few of its fields (same names, types, defaults and sources), checked here, so that
a command that only asks the stack (``capdisc discover``) starts without building
:class:`~capdisc.settings.Settings` (pydantic and its models are about a third of such a
command's start-up, ``benchmarks/cli_startup.py``). A value it does not check as
:class:`~capdisc.settings.Settings` would (anything but the plain forms below) makes
:meth:`ClientSettings.load` answer None: then build :class:`~capdisc.settings.Settings`, which
reads that value as it always does, or says what is wrong with it
(``capdisc_producers.access.command_settings``). ``tests/unit/test_settings.py`` checks that both
agree.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from capdisc.errors import ConfigError, ManifestError
from capdisc.tenants import tenant_problem

#: Environment variables that set a setting start with this.
ENV_PREFIX = "CAPDISC_"
SETTINGS_FILE_ENV = "CAPDISC_SETTINGS_FILE"
#: The Redis URL of settings that name none of their own.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def settings_file_values(
    environ: Mapping[str, str], path: Path | None = None
) -> tuple[Path | None, dict[str, Any]]:
    """The settings file (``path``, else ``CAPDISC_SETTINGS_FILE``'s, else none) and its values,
    unchecked (an unreadable file or bad YAML is a :class:`~capdisc.errors.ConfigError`)."""
    file_path = path or (
        Path(environ[SETTINGS_FILE_ENV]) if environ.get(SETTINGS_FILE_ENV) else None
    )
    return file_path, (_read_file(file_path) if file_path else {})


def environment_values(environ: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The ``CAPDISC_*`` variables set for the settings ``names``, by setting name, unchecked."""
    return {
        name: environ[f"{ENV_PREFIX}{name.upper()}"]
        for name in names
        if f"{ENV_PREFIX}{name.upper()}" in environ
    }


#: ``CAPDISC_*`` variables that are no setting but are read on purpose: by the settings loader
#: (the settings file), by the client and the commands (``capdisc_producers``, ``capdisc.client``,
#: :mod:`capdisc.stackfile`), by the benchmarks (:mod:`capdisc.bench.evaluation`), and by
#: ``docker-compose.yml`` (which reads them from the shell that runs it).
OTHER_VARIABLES = frozenset(
    {
        SETTINGS_FILE_ENV,
        "CAPDISC_STACK",
        "CAPDISC_TOKEN",
        "CAPDISC_BENCH_CACHE",
        "CAPDISC_REDIS_PASSWORD",
        "CAPDISC_WATCHER_TOKEN",
    }
)

#: The names of every setting a ``CAPDISC_*`` variable sets: the fields of
#: :class:`~capdisc.settings.Settings` and of :class:`~capdisc.discovery.config.DiscoveryConfig`
#: (kept here so that a command reading only :class:`ClientSettings` needs no pydantic;
#: ``tests/unit/test_settings.py`` checks it against both).
SETTING_NAMES = frozenset(
    {
        # Settings
        "redis_url", "redis_password_file", "tenant", "auth", "auth_keys_file", "embedder",
        "hashing_dim", "model_spin", "model_streams", "openai_model", "openai_base_url",
        "openai_api_key", "openai_dimensions", "openai_request_dimensions", "openai_batch_size",
        "openai_timeout_s", "openai_max_attempts", "query_cache_size", "query_cache_ttl_s",
        "query_cache_max_entries", "warm_texts", "manifest_max_bytes", "event_max_bytes",
        "publish_max_pending_tasks",
        "deadletter_payload_max_bytes", "deadletters_max_bytes",
        "watch_debounce_ms", "discover_timeout_s", "mcp_upstream_timeout_s",
        "mcp_max_result_bytes", "mcp_import_token", "claim_idle_ms", "reply_ttl_s",
        "heartbeat_interval_s", "worker_stale_after_s", "worker_forget_after_s",
        "up_log_max_bytes", "metrics_port", "metrics_host", "task_time_limit_s",
        "visibility_timeout_s", "indexing_max_attempts", "indexing_retry_base_s",
        "reconcile_interval_s", "outbox_grace_s", "outbox_give_up_s", "sweep_interval_s",
        "reindex_timeout_s", "tombstone_horizon_s", "poisoning_policy", "vector_store",
        "weaviate_url", "weaviate_grpc_host", "weaviate_grpc_port", "weaviate_api_key",
        "weaviate_collection", "weaviate_timeout_init_s", "weaviate_timeout_query_s",
        "weaviate_timeout_insert_s", "snapshot_dir", "snapshot_keep", "snapshot_interval_s",
        "map_above", "build_apart_timeout_s", "log_level", "log_format",
        # DiscoveryConfig
        "tier0_budget_tokens", "tier1_budget_tokens", "tier2_budget_tokens", "tier1_top_k",
        "tier2_top_k", "tier1_min_relevance", "use_graph_reranking", "graph_boost_factor",
        "collection_name", "token_counter", "fusion", "dense_weight", "exact_name_match",
        "decompose_queries", "entity_types", "pooled_parts_above", "abstain_threshold",
        "workflow_hints",
    }
)  # fmt: skip

_unknown_reported: set[str] = set()


def report_unknown_variables(
    environ: Mapping[str, str], setting_names: Iterable[str] = SETTING_NAMES
) -> list[str]:
    """Warn, once per process for each, of the ``CAPDISC_*`` variables in ``environ`` that
    neither set a setting (``setting_names``) nor are read elsewhere (:data:`OTHER_VARIABLES`):
    a misspelt one is ignored, and its setting keeps its default or file value. The warning
    names the closest known variable; the process still starts. Answers the names warned of
    now. Written through stdlib logging (``capdisc.settings``), as the process's logs are."""
    known = {f"{ENV_PREFIX}{name.upper()}" for name in setting_names} | OTHER_VARIABLES
    unknown = sorted(
        name
        for name in environ
        if name.startswith(ENV_PREFIX) and name not in known and name not in _unknown_reported
    )
    if not unknown:
        return []
    import difflib

    log = logging.getLogger("capdisc.settings")
    for name in unknown:
        _unknown_reported.add(name)
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]}? Rename it"
            if close
            else "unset it (the settings are the fields of capdisc.settings.Settings)"
        )
        log.warning("environment variable %s is no capdisc setting and is ignored; %s", name, hint)
    return unknown


def _read_file(path: Path) -> dict[str, Any]:
    from capdisc.registry.safeyaml import load_mapping

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"settings file {path} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"settings file {path} is not UTF-8 text (byte {exc.start} is not); save it as UTF-8"
        ) from exc
    try:
        return load_mapping(text, str(path))
    except ManifestError as exc:
        raise ConfigError(f"settings file {exc}") from exc


# -- Redis URLs ----------------------------------------------------------------------------------


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` (and the user it names, if any) in it."""
    parts = urlsplit(url)
    user = quote(parts.username or "", safe="")
    where = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{where}"))


def mask_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: what may be printed or stored."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}"
    return urlunsplit(parts._replace(netloc=netloc))


def with_password_file(url: str, password_file: Path | None) -> str:
    """``url`` with the password that ``password_file`` (``redis_password_file``) holds, read
    now; ``url`` itself when no file is named or it names a password of its own."""
    if password_file is None or urlsplit(url).password:
        return url
    try:
        password = password_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"redis_password_file {password_file} cannot be read "
            f"({exc.strerror}) (env CAPDISC_REDIS_PASSWORD_FILE)"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"redis_password_file {password_file} is not UTF-8 text (byte {exc.start} is not) "
            "(env CAPDISC_REDIS_PASSWORD_FILE); write the password as UTF-8 text"
        ) from exc
    return with_password(url, password)


#: The URL schemes redis-py connects with.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def redis_url_form(url: str) -> bool:
    """Whether ``url`` is in a form redis-py connects with (empty: not set, the stack's found)."""
    return redis_url_problem(url) is None


def redis_url_problem(url: str) -> str | None:
    """What keeps redis-py from reading ``url`` as meant, or None (empty: not set)."""
    if not url:
        return None
    if not url.startswith(REDIS_SCHEMES):
        return (
            f"must start with one of {', '.join(REDIS_SCHEMES)} (redis://HOST:PORT/DB), "
            f"got {mask_url(url)!r}"
        )
    parts = urlsplit(url)
    if parts.fragment or "@" in parts.path + parts.query:
        where = f"{parts.scheme}://***@{url.rsplit('@', 1)[1]}"  # no part of the password
        return (
            f"has a '#', '/', '?' or '@' in its password, which ends the password there "
            f"({where!r}); percent-encode them (%23, %2F, %3F, %40) or give the password in "
            "a file (CAPDISC_REDIS_PASSWORD_FILE)"
        )
    return None


def celery_broker_url(url: str, transport: str = "redis") -> str:
    """The URL a Celery app is given as its broker for the Redis ``url``: ``url`` itself, but a
    ``unix://`` socket, which kombu does not read, in kombu's form for one
    (``{transport}+socket://[user:password@]/path?virtual_host=db``); ``transport`` names the
    kombu transport that reads it."""
    if not url.startswith("unix://"):
        return url
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    db = query.get("db", ["0"])[0]
    user = quote(parts.username or query.get("username", [""])[0], safe="")
    password = parts.password or quote(query.get("password", [""])[0], safe="")
    login = f"{user}:{password}@" if user or password else ""
    return f"{transport}+socket://{login}{parts.path}?virtual_host={db}"


# -- the settings a command needs to reach the stack ---------------------------------------------


@dataclass(frozen=True)
class ClientSettings:
    """The fields of :class:`~capdisc.settings.Settings` that a command needs to reach the
    stack and ask it (documented there), with the same names, types and defaults."""

    redis_url: str = DEFAULT_REDIS_URL
    redis_password_file: Path | None = None
    tenant: str = "default"
    auth: bool | None = None
    auth_keys_file: Path | None = None
    discover_timeout_s: float = 5.0

    @classmethod
    def load(
        cls, environ: Mapping[str, str] | None = None, path: Path | None = None
    ) -> ClientSettings | None:
        """Defaults, then the settings file, then ``CAPDISC_*`` variables, as
        :meth:`Settings.load <capdisc.settings.Settings.load>` reads them, with the password
        file's password in ``redis_url``; None when a value is not in a form checked here
        (build :class:`~capdisc.settings.Settings` instead). Other settings are not read, so
        not checked either."""
        env = os.environ if environ is None else environ
        report_unknown_variables(env)
        names = [f.name for f in fields(cls)]
        from_file = settings_file_values(env, path)[1]
        values: dict[str, Any] = {name: from_file[name] for name in names if name in from_file}
        values.update(environment_values(env, names))
        checked = {name: _CHECKS[name](value) for name, value in values.items()}
        if any(value is _UNCHECKED for value in checked.values()):
            return None
        settings = cls(**checked)
        url = with_password_file(settings.redis_url, settings.redis_password_file)
        return settings if url == settings.redis_url else replace(settings, redis_url=url)


#: What a check answers for a value it does not decide (pydantic may still take it, or not).
_UNCHECKED: Any = object()
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _text(value: object) -> Any:
    return value if isinstance(value, str) else _UNCHECKED


def _redis_url(value: object) -> Any:
    return value if isinstance(value, str) and redis_url_form(value) else _UNCHECKED


def _tenant(value: object) -> Any:
    return value if isinstance(value, str) and tenant_problem(value) is None else _UNCHECKED


def _optional_path(value: object) -> Any:
    if value is None:
        return None
    return Path(value) if isinstance(value, str) else _UNCHECKED


def _optional_flag(value: object) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    return _UNCHECKED


def _positive_seconds(value: object) -> Any:
    """A number above 0: a YAML number, or digits with at most one decimal point."""
    if isinstance(value, str) and value.replace(".", "", 1).isdigit() and value.isascii():
        value = float(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        return number if number > 0 and math.isfinite(number) else _UNCHECKED
    return _UNCHECKED


_CHECKS: dict[str, Callable[[object], Any]] = {
    "redis_url": _redis_url,
    "redis_password_file": _optional_path,
    "tenant": _tenant,
    "auth": _optional_flag,
    "auth_keys_file": _optional_path,
    "discover_timeout_s": _positive_seconds,
}
