"""What the proxy answers itself, when the frontend cannot: OpenAI-style JSON errors.

The handler (``serving/proxy.py``) answers 400 (a target or body it cannot
read), 408 (a body not received within ``listen.body_timeout_s``), 413 (a body
over ``upstream.max_request_bytes``), and, when the frontend fails before its
response started, 502 or 504: ``upstream_failure`` says which, how the exchange
ended for the worker, and under which kind it is counted. Never client text in
an answer or a log line: messages are fixed, errors named by their type.
"""

from __future__ import annotations

import json

import aiohttp
import attrs
from aiohttp import web

from shadow_proxy.exchange import EndKind


def error_response(
    status: int, message: str, kind: str, request_id: str, header: str
) -> web.Response:
    """An OpenAI-style JSON error answered by the proxy itself."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers={header: request_id},
    )


@attrs.frozen
class UpstreamFailure:
    """The frontend failed before its response started: what the client gets."""

    #: How the exchange ended, and the end message's detail (fixed words).
    end: EndKind
    detail: str
    #: ``shadow_proxy_upstream_errors_total{kind}``.
    kind: str
    status: int
    message: str
    code: str
    #: The operator's line (no client text): the error's type or the OS's words.
    log_line: str

    def response(self, request_id: str, header: str) -> web.Response:
        return error_response(self.status, self.message, self.code, request_id, header)


def upstream_failure(error: Exception) -> UpstreamFailure:
    """What a failure of the frontend before its response started means."""
    if isinstance(error, aiohttp.SocketTimeoutError):
        # Connected, but no response headers within ``read_timeout_s``.
        return UpstreamFailure(
            EndKind.TIMEOUT,
            "read timeout",
            "read_timeout",
            504,
            "the frontend did not answer in time",
            "upstream_timeout",
            "upstream read timeout before the response started",
        )
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamFailure(
            EndKind.UPSTREAM_FAILED,
            "connect timeout",
            "connect_timeout",
            504,
            "the frontend did not accept a connection in time",
            "upstream_timeout",
            f"upstream connect timeout: {type(error).__name__}",
        )
    if isinstance(error, aiohttp.ClientConnectorError):
        why = error.os_error.strerror or type(error.os_error).__name__
        return UpstreamFailure(
            EndKind.UPSTREAM_FAILED,
            "connect failed",
            "connect",
            502,
            "the frontend cannot be reached",
            "upstream_unreachable",
            f"upstream unreachable: {why}",
        )
    return UpstreamFailure(
        EndKind.UPSTREAM_FAILED,
        "upstream failed before responding",
        "bad_response",
        502,
        "the frontend failed before responding",
        "upstream_error",
        f"upstream failed before responding: {type(error).__name__}",
    )
