"""The indexing queue's envelope check: a kombu message passes, anything else names its field."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from capdisc_workers.queueguard import MalformedEntry, checked_message


def message(**changes: Any) -> dict[str, Any]:
    """A queue entry shaped as kombu's Redis transport writes a Celery task."""
    entry: dict[str, Any] = {
        "body": base64.b64encode(b'[["{}"], {}, {}]').decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"task": "capdisc.indexing.apply_event", "id": "t1"},
        "properties": {
            "delivery_tag": "d1",
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": "indexing"},
        },
    }
    entry.update(changes)
    return entry


def test_a_kombu_message_passes_unchanged() -> None:
    assert checked_message(json.dumps(message())) == message()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json at all", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("[" * 5000, "nested too deeply"),  # RecursionError escaped: the worker exited
        (json.dumps({"body": "xx", "headers": {}}), "'properties'"),
        (json.dumps(message(properties={"body_encoding": "base64"})), "delivery_tag"),
        (json.dumps(message(properties={"delivery_tag": "d"})), "delivery_info"),
        (json.dumps(message(headers=["task"])), "'headers'"),
        (json.dumps(message(body=7)), "'body'"),
        (json.dumps(message(body="é")), "not base64"),
    ],
)
def test_an_entry_that_is_no_message_is_refused_naming_what(text: str, named: str) -> None:
    with pytest.raises(MalformedEntry, match=named):
        checked_message(text)
