"""What the proxy answers itself: each failure of the frontend before its response
started is a 502 or a 504, an end kind and a counted kind; the JSON error shape."""

from __future__ import annotations

import json

import aiohttp
import pytest

from shadow_proxy.exchange import EndKind
from shadow_proxy.serving.answers import error_response, upstream_failure


class _Key:
    host, port, ssl = "frontend", 8000, False


@pytest.mark.parametrize(
    ("error", "status", "kind", "end"),
    [
        (aiohttp.SocketTimeoutError("x"), 504, "read_timeout", EndKind.TIMEOUT),
        (aiohttp.ServerTimeoutError("x"), 504, "connect_timeout", EndKind.UPSTREAM_FAILED),
        (TimeoutError(), 504, "connect_timeout", EndKind.UPSTREAM_FAILED),
        (
            aiohttp.ClientConnectorError(_Key(), ConnectionRefusedError(111, "refused")),
            502,
            "connect",
            EndKind.UPSTREAM_FAILED,
        ),
        (aiohttp.ServerDisconnectedError(), 502, "bad_response", EndKind.UPSTREAM_FAILED),
    ],
    ids=["read-timeout", "connect-timeout", "timeout", "unreachable", "disconnected"],
)
def test_upstream_failures(error: Exception, status: int, kind: str, end: EndKind) -> None:
    failure = upstream_failure(error)
    assert (failure.status, failure.kind, failure.end) == (status, kind, end)
    response = failure.response("rid-1", "x-request-id")
    assert response.status == status and response.headers["x-request-id"] == "rid-1"


def test_error_shape() -> None:
    response = error_response(413, "too big", "request_too_large", "r", "x-request-id")
    assert response.body is not None
    assert json.loads(bytes(response.body)) == {
        "error": {"message": "too big", "type": "request_too_large", "code": 413}
    }
