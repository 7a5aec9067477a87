"""The log configuration: JSON lines whose tracebacks never carry local variables."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from capdisc.logs import configure_logging, get_logger


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers, root.level = handlers, level
    structlog.reset_defaults()


def _fail_with_a_secret() -> None:
    token = "s3cret-token-value"  # noqa: F841 (a local the traceback must not show)
    raise ValueError("the check failed")


@pytest.mark.usefixtures("restore_logging")
def test_a_logged_exception_keeps_its_frames_but_not_their_local_variables() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)

    try:
        _fail_with_a_secret()
    except ValueError:
        get_logger("capdisc.test").exception("check_failed")

    line = stream.getvalue().strip().splitlines()[-1]
    (raised,) = json.loads(line)["exception"]
    assert raised["exc_type"] == "ValueError"
    assert [f["name"] for f in raised["frames"]][-1] == "_fail_with_a_secret"
    assert "s3cret-token-value" not in line
