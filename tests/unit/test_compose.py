"""The deployment files say what infra/README.md promises. Parsed as data: no Docker needed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "infra" / "Dockerfile"
REDIS_CONF = ROOT / "infra" / "redis.conf"

PROMISED_SERVICES = {
    "redis",
    "weaviate",
    "indexing-worker",
    "discovery-worker-1",
    "discovery-worker-2",
    "watcher",
}
CAPDISC_SERVICES = {"indexing-worker", "discovery-worker-1", "discovery-worker-2", "watcher"}


class MissingVariable(Exception):
    """A ``${NAME:?error}`` variable is unset: compose refuses to start."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def _interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` substitution."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, rest = match.group(1), match.group(2), match.group(3)
        if environ.get(name):
            return environ[name]
        if operator == ":-":
            return rest or ""
        if operator == ":?":
            raise MissingVariable(f"{name}: {rest}")
        return ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}", substitute, value)


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return [str(part) for part in command] if isinstance(command, list) else command.split()


def _option(command: list[str], name: str) -> str | None:
    """The value after ``--name`` in an argv list, or None."""
    for i, part in enumerate(command[:-1]):
        if part == name:
            return command[i + 1]
    return None


def _dockerfile_instructions() -> list[str]:
    """Dockerfile instructions, comments dropped and backslash continuations joined."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_compose_names_every_service_the_readme_promises(services: dict[str, Any]) -> None:
    assert set(services) >= PROMISED_SERVICES


def test_compose_file_has_no_anchors_aliases_or_extension_fields(compose: dict[str, Any]) -> None:
    events = list(yaml.parse(COMPOSE.read_text(encoding="utf-8")))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent)]
    assert not [e for e in events if getattr(e, "anchor", None)]
    assert not [key for key in compose if str(key).startswith("x-")]


def test_redis_runs_with_append_only_file(services: dict[str, Any]) -> None:
    command = _command(services["redis"])
    assert _option(command, "--appendonly") == "yes"
    assert _option(command, "--appendfsync") == "everysec"


def test_redis_never_evicts_keys(services: dict[str, Any]) -> None:
    assert _option(_command(services["redis"]), "--maxmemory-policy") == "noeviction"


def test_redis_config_file_keeps_the_same_durability_settings() -> None:
    settings: dict[str, str] = {}
    for line in REDIS_CONF.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.strip().partition(" ")
            settings.setdefault(name, value)
    assert settings["appendonly"] == "yes"
    assert settings["appendfsync"] == "everysec"
    assert settings["maxmemory-policy"] == "noeviction"
    assert settings["maxmemory"] not in ("0", "")  # without a ceiling the policy never applies


def test_the_capdisc_services_are_the_ones_built_from_the_dockerfile(
    services: dict[str, Any],
) -> None:
    built = {name for name, service in services.items() if "build" in service}
    assert built == CAPDISC_SERVICES
    for name in built:
        assert services[name]["build"]["dockerfile"] == "infra/Dockerfile"


def test_every_capdisc_service_points_at_the_redis_service(services: dict[str, Any]) -> None:
    environ = {"CAPDISC_REDIS_PASSWORD": "0123abcd"}
    for name in CAPDISC_SERVICES:
        raw = services[name]["environment"]["CAPDISC_REDIS_URL"]
        url = urlsplit(_interpolate(raw, environ))
        assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379), name


def test_redis_and_its_clients_share_one_password(services: dict[str, Any]) -> None:
    environ = {"CAPDISC_REDIS_PASSWORD": "0123abcd"}
    command = [_interpolate(part, environ) for part in _command(services["redis"])]
    assert _option(command, "--requirepass") == "0123abcd"
    for name in CAPDISC_SERVICES:
        raw = services[name]["environment"]["CAPDISC_REDIS_URL"]
        assert urlsplit(_interpolate(raw, environ)).password == "0123abcd", name


def test_compose_refuses_to_start_without_a_redis_password(services: dict[str, Any]) -> None:
    raw = services["indexing-worker"]["environment"]["CAPDISC_REDIS_URL"]
    with pytest.raises(MissingVariable, match="CAPDISC_REDIS_PASSWORD"):
        _interpolate(raw, {})


def test_every_capdisc_service_waits_for_a_healthy_redis(services: dict[str, Any]) -> None:
    assert "healthcheck" in services["redis"]
    for name in CAPDISC_SERVICES:
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_indexing_worker_consumes_the_indexing_queue_with_celery(
    services: dict[str, Any],
) -> None:
    command = _command(services["indexing-worker"])
    assert command[:4] == ["celery", "-A", "capdisc_workers.celery_app", "worker"]
    assert _option(command, "-Q") == "indexing"
    assert _option(command, "-P") == "solo"


def test_discovery_workers_run_the_discovery_module(services: dict[str, Any]) -> None:
    for name in ("discovery-worker-1", "discovery-worker-2"):
        assert _command(services[name]) == ["python", "-m", "capdisc_workers.discovery"], name


def test_watcher_watches_the_example_registry_mounted_read_only(
    services: dict[str, Any],
) -> None:
    watcher = services["watcher"]
    assert _command(watcher) == ["capdisc", "watch", "/registry"]
    assert "./examples/registry:/registry:ro" in watcher["volumes"]


def test_weaviate_exposes_rest_and_grpc_without_a_vectorizer(services: dict[str, Any]) -> None:
    weaviate = services["weaviate"]
    published = {str(port).rsplit(":", 1)[-1] for port in weaviate["ports"]}
    assert {"8080", "50051"} <= published
    assert weaviate["environment"]["DEFAULT_VECTORIZER_MODULE"] == "none"
    assert weaviate["environment"]["AUTOSCHEMA_ENABLED"] == "false"
    assert not weaviate["image"].endswith(":latest")


def test_dockerfile_installs_the_package() -> None:
    assert DOCKERFILE.is_file()
    instructions = _dockerfile_instructions()
    installs = [
        m
        for i in instructions
        if (m := re.fullmatch(r"RUN pip install --no-cache-dir '\.\[([a-z,-]+)\]'", i))
    ]
    assert installs
    # The base install is the client alone: the processes need the stack's extra, and the
    # workers docker-compose.yml points at Weaviate need its client.
    assert {"workers", "weaviate"} <= set(installs[-1].group(1).split(","))
    for source in ("pyproject.toml", "README.md", "shared/", "workers/", "producers/"):
        assert any(i.startswith("COPY ") and source in i.split() for i in instructions), source


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [i.split()[1] for i in _dockerfile_instructions() if i.startswith("USER ")]
    assert users
    assert users[-1] not in ("root", "0")


WORKER_SERVICES = {"indexing-worker", "discovery-worker-1", "discovery-worker-2"}


def test_workers_require_identity_tokens_verified_with_a_mounted_keyring(
    compose: dict[str, Any],
    services: dict[str, Any],
) -> None:
    secret = compose["secrets"]["capdisc_auth_keys"]
    assert secret["file"] == "./infra/secrets/auth_keys.json"
    for name in WORKER_SERVICES:
        environment = services[name]["environment"]
        assert environment["CAPDISC_AUTH"] == "on", name
        assert environment["CAPDISC_AUTH_KEYS_FILE"] == "/run/secrets/capdisc_auth_keys", name
        assert services[name]["secrets"] == ["capdisc_auth_keys"], name


def test_the_watcher_publishes_with_a_token_and_holds_no_keyring(services: dict[str, Any]) -> None:
    watcher = services["watcher"]
    with pytest.raises(MissingVariable, match="CAPDISC_WATCHER_TOKEN"):
        _interpolate(watcher["environment"]["CAPDISC_TOKEN"], {})
    assert "secrets" not in watcher
    assert not any(k.startswith("CAPDISC_AUTH") for k in watcher["environment"])


def test_the_keyring_directory_is_not_committed() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "infra/secrets/" in ignored
