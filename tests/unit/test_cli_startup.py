"""The ``capdisc`` command starts without the heavy modules it does not use (lazy imports).

Behavioural, never timed: each case runs in a fresh interpreter and looks at what it imported.
``benchmarks/cli_startup.py`` measures the time.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capdisc.agents.formats import TOOL_FORMATS
from capdisc.registry.flags import FLAG_STATES, POLICIES
from capdisc_producers import cli, flags_cli

#: Modules that cost start-up and that neither `capdisc --help` nor `--version` needs.
HEAVY = (
    "numpy",
    "redis",
    "redis.asyncio",
    "structlog",
    "pydantic",
    "jwt",
    "celery",
    "capdisc.client",
    "capdisc.settings",
    "capdisc.discovery.engine",
    "capdisc.registry.poisoning",
    "capdisc_producers.bench_cli",
    "capdisc_producers.token_cli",
    "capdisc_producers.stack",
)

#: Prints, as the interpreter exits, which of the modules in argv[1] (JSON) were imported.
REPORT = (
    "import atexit, json, sys\n"
    "watched = json.loads(sys.argv.pop(1))\n"
    "atexit.register(lambda: print(json.dumps([m for m in watched if m in sys.modules]),"
    " file=sys.stderr))\n"
)


def loaded(
    code: str, *argv: str, modules: tuple[str, ...] = HEAVY, cwd: Path | None = None
) -> list[str]:
    """The ``modules`` a fresh interpreter running ``code`` (with ``argv``, in ``cwd``, without
    ``CAPDISC_*`` variables) imported."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT + code, json.dumps(modules), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")},
    )
    found: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return found


def test_importing_the_command_loads_no_heavy_module() -> None:
    assert loaded("import capdisc_producers.cli") == []


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_load_no_heavy_module(option: str) -> None:
    code = "from capdisc_producers.launcher import main\nsys.argv[0] = 'capdisc'\nmain()"
    assert loaded(code, option) == []


#: What ``capdisc discover`` needs neither: it reads the client settings without pydantic, and
#: the client takes the tool format names from a module of their own.
NOT_FOR_DISCOVER = (
    "numpy",
    "structlog",
    "pydantic",
    "yaml",
    "jwt",
    "celery",
    "capdisc.settings",
    "capdisc.discovery.config",
    "capdisc.sessions.policy",
    "capdisc.agents.formats",
    "capdisc.registry.flags",
    "capdisc.registry.poisoning",
    "capdisc.discovery.engine",
)


def test_discover_loads_neither_pydantic_nor_the_flags(tmp_path: Path) -> None:
    code = "from capdisc_producers.launcher import main\nsys.argv[0] = 'capdisc'\nmain()"
    argv = ("discover", "a query", "--redis-url", "redis://127.0.0.1:1/0")  # refused at once

    assert loaded(code, *argv, modules=(*NOT_FOR_DISCOVER, "capdisc.client"), cwd=tmp_path) == [
        "capdisc.client"
    ]


def test_the_client_loads_neither_the_token_library_nor_status_nor_sessions() -> None:
    modules = ("jwt", "capdisc.status", "capdisc.sessions.store", "numpy")
    assert loaded("import capdisc.client", modules=modules) == []


@pytest.mark.parametrize("name", sorted(cli.LAZY_COMMANDS))
def test_a_lazy_command_is_listed_with_its_own_help(name: str) -> None:
    module, attribute, help_text = cli.LAZY_COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    assert " ".join(command.help.split()) == help_text


def test_the_choices_spelt_out_in_the_command_match_their_sources() -> None:
    assert (
        tuple(TOOL_FORMATS),
        tuple(FLAG_STATES),
        tuple(POLICIES),
    ) == (cli.TOOL_FORMATS, flags_cli.FLAG_STATES, flags_cli.POLICIES)
