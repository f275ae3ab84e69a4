"""The request handler: forward, stream back, hand off. Nothing else.

Runs on the serving loop. Per request it reads the body, picks the request id,
stamps arrival, forwards to the frontend and writes each body chunk back as it
arrives. With taps configured it also hands the request bytes and the
response chunks to the tap worker through ``Handoff`` (non-blocking, counted
when full). It never parses, tokenizes, encodes or logs a body.

Guarantees:
- the request target and body are forwarded byte for byte: the body as it
  came (a gzip body stays gzip; the server does not decompress, see
  ``serving/server.py``), the target as the client wrote it (no dot-segment
  removal, no re-quoting: ``URL(..., encoded=True)``); an absolute-form target
  (``GET http://host/path``) is forwarded by its path and query, as uvicorn
  and hyper read it. aiohttp's client drops a fragment and a bare trailing
  ``?`` (neither carries meaning for a frontend); docs/design.md;
- the client gets the frontend's status, end-to-end headers and body bytes;
- a client that hangs up cancels the handler (``handler_cancellation``), which
  closes the upstream connection at once so the frontend stops generating;
- the proxy answers itself only when the frontend cannot: 502 (unreachable, or
  broken before the response started), 504 (connect timeout), 413 (body over
  ``max_request_bytes``), 408 (body not received within
  ``listen.body_timeout_s``), 400 (a body the HTTP parser cannot read), as
  OpenAI-style JSON errors (``serving/answers.py``); 413 and 408 on mirrored routes are counted in
  ``shadow_not_mirrored_total`` (the worker never sees them);
- every exchange handed to the worker gets exactly one end message;
- at shutdown (``stop``) in-flight exchanges get the grace period, once, then
  are cancelled and end as ``shutdown``.

Operator log lines (413s, 408s, streams the frontend broke) are rate-limited
and hold the route and the error type, never a header or a body byte.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.exchange import EndKind, Route, classify
from shadow_proxy.serving.answers import error_response, upstream_failure
from shadow_proxy.serving.handoff import Capture, Handoff
from shadow_proxy.serving.headers import (
    client_response_headers,
    new_request_id,
    upstream_request_headers,
    upstream_target,
)
from shadow_proxy.serving.logs import RateLimited
from shadow_proxy.serving.metrics import ProxyMetrics
from shadow_proxy.sockets import ack_now

log = logging.getLogger(__name__)

#: Bodies above this size are written upstream in slices (with their
#: Content-Length), so one large write does not hold the loop.
LARGE_BODY_BYTES = 1024 * 1024
SLICE_BYTES = 256 * 1024
#: At shutdown, how long cancelled exchanges get to end (write their end
#: message, close their upstream connection) after the grace period.
CANCEL_WAIT_S = 1.0


class ProxyHandler:
    """Forwards every request to ``upstream_url``; see the module docstring."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        upstream_url: str,
        request_id_header: str,
        max_request_bytes: int,
        metrics: ProxyMetrics,
        handoff: Handoff | None,
        body_timeout_s: float = 60.0,
        quick_ack: bool = True,
        not_mirrored: Callable[[str], None] | None = None,
    ):
        self.session = session
        self.upstream_url = upstream_url
        self.request_id_header = request_id_header
        self.max_request_bytes = max_request_bytes
        self.metrics = metrics
        self.handoff = handoff
        self.body_timeout_s = body_timeout_s
        self.quick_ack = quick_ack
        #: Counts a mirrored-route request answered here (taps configured only).
        self.not_mirrored = not_mirrored if handoff is not None else None
        self.shutting_down = False
        self.oplog = RateLimited(log)
        #: The handlers running now (``stop`` gives them the grace, then cancels).
        self._tasks: set[asyncio.Task] = set()

    async def stop(self, grace_s: float) -> None:
        """At shutdown, after the server stopped accepting: in-flight exchanges
        get ``grace_s`` to end on their own, then are cancelled (their records
        end as ``shutdown``). Waits once, so a stream is cut at the grace."""
        self.shutting_down = True
        tasks = set(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        if pending:
            log.warning(
                "shutdown: %d exchange(s) still open after the %.1fs grace; cutting them",
                len(pending),
                grace_s,
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=CANCEL_WAIT_S)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        arrival_unix_ns = time.time_ns()
        arrival_mono_ns = time.monotonic_ns()
        route = classify(request.method, request.path)
        label = route.label
        header = self.request_id_header
        request_id = request.headers.get(header) or new_request_id()
        stats = self.metrics.stats
        stats.started()
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        status = 0
        try:
            response = await self._exchange(
                request, route, request_id, arrival_unix_ns, arrival_mono_ns
            )
            status = response.status
            return response
        except _ClientGone as gone:
            status = 499  # the client went away (nginx's convention)
            return gone.response
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            self._tasks.discard(task)
            stats.finished(label, status, (time.monotonic_ns() - arrival_mono_ns) / 1e9)

    async def _exchange(self, request, route, request_id, arrival_unix_ns, arrival_mono_ns):
        header = self.request_id_header
        target = upstream_target(request.raw_path)
        if target is None:
            return error_response(
                400,
                "the request target must be a path or an http(s) URL",
                "invalid_request_target",
                request_id,
                header,
            )
        if (request.content_length or 0) > self.max_request_bytes:
            return self._too_large(request_id, route)
        try:
            # The bytes as they came: the server does not decompress
            # (``auto_decompress=False``), so a gzip body stays gzip.
            async with asyncio.timeout(self.body_timeout_s):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(request_id, route)
        except TimeoutError:
            return self._body_timeout(request_id, route)
        except (web.RequestPayloadError, HttpProcessingError) as e:
            # A malformed body (chunked framing; aiohttp's C parser wraps the
            # error, its Python parser does not): the text quotes client bytes.
            self.metrics.rejected_requests.labels("bad_body").inc()
            self.oplog.log(
                "bad_body",
                logging.WARNING,
                "answered 400 on %s: the request body cannot be read (%s)",
                route.label,
                type(e.__cause__ or e).__name__,
            )
            response = error_response(
                400, "the request body cannot be read", "invalid_request_body", request_id, header
            )
            response.force_close()
            return response

        capture: Capture | None = None
        if self.handoff is not None and route.mirrored:
            capture = self.handoff.open(
                route,
                request_id,
                body,
                arrival_unix_ns,
                arrival_mono_ns,
                engine_headers.pick(request.raw_headers),
                request.headers.get("Content-Encoding", ""),
            )

        headers = upstream_request_headers(
            request.headers,
            request_id_header=header,
            request_id=request_id,
            peer=request.remote,
            scheme=request.scheme,
        )
        # encoded=True: yarl neither re-quotes nor removes dot segments.
        url = URL(self.upstream_url + target, encoded=True)
        data = body or None
        if len(body) > LARGE_BODY_BYTES:
            headers["Content-Length"] = str(len(body))
            data = _slices(body)
        end, detail = EndKind.CLEAN, ""
        proxy_answer: web.Response | None = None
        # When the frontend gets the request: a record's latencies start here, as
        # a replayer's start when it sends (the client's body upload excluded).
        sent_mono_ns = time.monotonic_ns()
        try:
            async with self.session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            ) as upstream:
                if self.quick_ack:
                    ack_now(upstream.connection)
                streamed = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=client_response_headers(
                        upstream.headers, request_id_header=header, request_id=request_id
                    ),
                )
                if capture is not None:
                    capture.head(
                        upstream.status,
                        upstream.headers.get("Content-Type", ""),
                        upstream.headers.get("Content-Encoding", ""),
                        sent_mono_ns,
                    )
                await streamed.prepare(request)
                end, detail = await self._stream(
                    request, upstream, streamed, capture, route, arrival_mono_ns
                )
                return streamed
        except (asyncio.CancelledError, _ClientGone):
            end = EndKind.SHUTDOWN if self.shutting_down else EndKind.CLIENT_GONE
            if end is EndKind.CLIENT_GONE:
                self.metrics.client_disconnects.labels(route.label).inc()
            raise
        except (TimeoutError, aiohttp.ClientError) as e:
            # Before the response started: the proxy answers 502 or 504 (answers.py).
            failure = upstream_failure(e)
            end, detail = failure.end, failure.detail
            self.metrics.upstream_errors.labels(failure.kind).inc()
            log.warning("%s", failure.log_line)
            proxy_answer = failure.response(request_id, header)
            return proxy_answer
        finally:
            if capture is not None:
                if proxy_answer is not None:
                    capture.head(proxy_answer.status, "application/json", "")
                capture.end(end, detail)

    async def _stream(self, request, upstream, response, capture, route, arrival_mono_ns):
        """Copy the body to the client chunk by chunk; returns how it ended.

        When the frontend breaks mid-body, the client connection is closed
        after what was written is flushed, without the end-of-body marker, so
        the client sees a broken stream as it would from the frontend.
        """
        first = True
        content = upstream.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                # When the frontend's bytes came (a record's token offsets), before
                # the write to the client, as a replayer times its own reads.
                received = time.monotonic_ns()
                if first:
                    first = False
                    ttfb = (received - arrival_mono_ns) / 1e9
                    self.metrics.stats.first_byte(route.label, ttfb)
                try:
                    await response.write(chunk)
                except ConnectionResetError as e:
                    # The client went away and its transport is closing; the
                    # write failed before the handler was cancelled. This is
                    # aiohttp's ClientConnectionResetError, also a ClientError:
                    # caught here so it is not taken for a broken frontend.
                    raise _ClientGone(response) from e
                if capture is not None:
                    capture.chunk(chunk, received)
        except (TimeoutError, aiohttp.ServerTimeoutError):
            self.metrics.upstream_errors.labels("read_timeout").inc()
            self.oplog.log(
                "stream_timeout",
                logging.WARNING,
                "the frontend's response on %s stalled past upstream.read_timeout_s; "
                "the client's stream was cut",
                route.label,
            )
            _break(request, response)
            return EndKind.TIMEOUT, "read timeout"
        except (aiohttp.ClientError, OSError) as e:
            self.metrics.upstream_errors.labels("broken").inc()
            self.oplog.log(
                "stream_broken",
                logging.WARNING,
                "the frontend's response on %s broke mid-stream (%s); the client's stream was cut",
                route.label,
                type(e).__name__,
            )
            _break(request, response)
            return EndKind.UPSTREAM_BROKEN, "connection to the frontend broke"
        await response.write_eof()
        return EndKind.CLEAN, ""

    def _too_large(self, request_id: str, route: Route) -> web.Response:
        """413: the body is over ``upstream.max_request_bytes`` (counted, logged)."""
        if self.not_mirrored is not None and route.mirrored:
            self.not_mirrored("too_large")
        self.oplog.log(
            "too_large",
            logging.WARNING,
            "answered 413 on %s: the request body exceeds upstream.max_request_bytes (%d)",
            route.label,
            self.max_request_bytes,
        )
        message = f"request body exceeds the proxy's limit of {self.max_request_bytes} bytes"
        response = error_response(
            413, message, "request_too_large", request_id, self.request_id_header
        )
        response.force_close()
        return response

    def _body_timeout(self, request_id: str, route: Route) -> web.Response:
        """408: the body did not arrive within ``listen.body_timeout_s``."""
        self.metrics.body_timeouts.inc()
        if self.not_mirrored is not None and route.mirrored:
            self.not_mirrored("body_timeout")
        self.oplog.log(
            "body_timeout",
            logging.WARNING,
            "answered 408 on %s: the request body did not arrive within "
            "listen.body_timeout_s (%.0fs)",
            route.label,
            self.body_timeout_s,
        )
        message = f"the request body did not arrive within {self.body_timeout_s:g}s"
        response = error_response(
            408, message, "request_timeout", request_id, self.request_id_header
        )
        response.force_close()
        return response


class _ClientGone(Exception):
    """The client's connection failed under a write: it went away."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("client went away")
        self.response = response


def _break(request: web.Request, response: web.StreamResponse) -> None:
    """End the client's response as broken: flush, then close the connection,
    so aiohttp cannot write the end-of-body marker after the handler returns."""
    response.force_close()
    if request.transport is not None:
        request.transport.close()


async def _slices(body: bytes):
    view = memoryview(body)
    for start in range(0, len(view), SLICE_BYTES):
        yield view[start : start + SLICE_BYTES]
