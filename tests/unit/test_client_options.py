"""The client's own options are checked before anything is sent: a wait that is not a number
of seconds above 0 (and at most a year) is an error naming it. No Redis is reached: the
connection names a port nothing listens on."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import redis

from capdisc.client import Client
from capdisc.errors import ConfigError, RequestEncodeError

NOWHERE = redis.Redis(port=1, socket_connect_timeout=0.1)
BAD_WAITS = [float("inf"), float("nan"), 0, -1.0, 1e14, "5", None, True]


@pytest.mark.parametrize("wait", BAD_WAITS)
def test_a_client_with_a_bad_wait_is_refused_naming_it(wait: Any) -> None:
    with pytest.raises(ConfigError, match="Client timeout_s must be"):
        Client(NOWHERE, timeout_s=wait)
    with pytest.raises(ConfigError, match="Client resend_after_s must be"):
        Client(NOWHERE, resend_after_s=wait)


@pytest.mark.parametrize("wait", [w for w in BAD_WAITS if w is not None])
def test_a_call_with_a_bad_timeout_is_refused_naming_it_before_anything_is_sent(
    wait: Any,
) -> None:
    with pytest.raises(ConfigError, match=r"^timeout_s must be"):
        Client(NOWHERE).discover("refund a payment", timeout_s=wait)


def test_a_long_wait_is_taken_as_given() -> None:
    assert Client(NOWHERE, timeout_s=86400 * 30, resend_after_s=2).timeout_s == 86400 * 30


NO_EVENT_IDS = ["zzz", "", "-1", "1-", "1-2-3", ">", "99999999999999999999999-0"]


@pytest.mark.parametrize("after", NO_EVENT_IDS)
def test_watching_after_what_is_no_event_id_is_refused_naming_it_before_anything_is_sent(
    after: str,
) -> None:
    with pytest.raises(ConfigError, match=r"^watch_session after must be an event id"):
        Client(NOWHERE).watch_session("run-42", after=after)


@pytest.mark.parametrize("after", ["0-0", "0", "1795976883659-0", "1795976883659", "$"])
def test_watching_after_an_event_id_is_taken(after: str) -> None:
    Client(NOWHERE).watch_session("run-42", after=after)  # nothing is sent before iterating


@pytest.mark.parametrize("request_id", ["a b", "x" * 129, "naïve", 42])
def test_a_request_id_no_worker_could_answer_is_refused_naming_it_before_anything_is_sent(
    request_id: Any,
) -> None:
    with pytest.raises(RequestEncodeError, match="request field 'request_id' must be "):
        Client(NOWHERE).discover("refund a payment", request_id=request_id)
    with pytest.raises(RequestEncodeError, match="request field 'request_id' must be "):
        Client(NOWHERE).record_tool_call("run-1", "tool:x", request_id=request_id)


def test_a_token_whose_claims_are_nested_too_deeply_names_no_tenant() -> None:
    claims = base64.urlsafe_b64encode(b"[" * 5000).decode().rstrip("=")

    client = Client(NOWHERE, token=f"header.{claims}.signature")  # the workers refuse it

    assert client.tenant == "default"
