"""Shared setup for the unit tests: pure code only, no Redis, no network."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "model: loads the bundled MiniLM ONNX model from installed packages (offline, "
        "about 1 s); deselect with -m 'not model'",
    )
