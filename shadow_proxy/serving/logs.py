"""What the serving process logs about clients and traffic: rate-limited, and
never a byte a client sent.

Two tools, used from the serving loop (no I/O of their own beyond logging):

- ``RateLimited``: an operator's log line for events that repeat (a 413, a
  frontend stream that breaks, a tap that drops, the connection cap): at most
  ``burst`` lines per key, then one line per ``interval_s`` saying how many
  were left out since the last line. A flood of the same event costs a few
  lines, not megabytes.
- ``ClientErrorFilter``: takes over the HTTP server's error logging (aiohttp's
  ``aiohttp.server`` logger, and the logger the proxy gives its server). The
  parser's exceptions quote the raw request line or header line that failed
  (bad characters, bare CR, obs-fold, ``Authorization :``, oversized headers,
  malformed chunked bodies), which can hold an API key or a prompt. The filter
  keeps the error's kind (a fixed vocabulary from the exception type) and the
  peer address, drops the message, traceback and arguments, and rate-limits.

Guarantee: a record that passes ``ClientErrorFilter`` holds no text but the
kind, the peer address and the fixed message.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable

from aiohttp import http_exceptions as hx


class RateLimited:
    """Rate-limited log lines: ``burst`` lines per key, then one per ``interval_s``.

    ``log(key, level, msg, *args)`` logs or counts the line as left out; a line
    that follows left-out ones ends with ``(N similar lines left out)``.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        #: key -> [lines allowed in the current window, window start, left out]
        self._state: dict[str, list] = {}

    def allow(self, key: str) -> int | None:
        """None when this line is left out; else how many were left out before it."""
        now = self.clock()
        state = self._state.get(key)
        if state is None or now - state[1] >= self.interval_s:
            left_out = state[2] if state is not None else 0
            self._state[key] = [1, now, 0]
            return left_out
        if state[0] < self.burst:
            state[0] += 1
            return 0
        state[2] += 1
        return None

    def log(self, key: str, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless over the rate for ``key``; True when logged."""
        left_out = self.allow(key)
        if left_out is None:
            return False
        if left_out:
            msg += " (%d similar lines left out)"
            args = (*args, left_out)
        self.logger.log(level, msg, *args)
        return True


#: Error kinds of the HTTP parser, by exception type (most specific first).
_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (hx.BadHttpMethod, "bad_method"),
    (hx.LineTooLong, "too_long"),
    (hx.InvalidURLError, "bad_target"),
    (hx.BadStatusLine, "bad_request_line"),
    (hx.InvalidHeader, "bad_header"),
    (hx.TransferEncodingError, "bad_body"),
    (hx.ContentLengthError, "bad_body"),
    (hx.PayloadEncodingError, "bad_body"),
    (hx.BadHttpMessage, "bad_request"),
    (hx.HttpProcessingError, "bad_request"),
)
#: Every kind the filter reports (metric label values come from here).
CLIENT_ERROR_KINDS = (
    "bad_method",
    "too_long",
    "bad_target",
    "bad_request_line",
    "bad_header",
    "bad_body",
    "bad_request",
    "internal_error",
)


def error_kind(exc: BaseException) -> str:
    """The kind of a server error, from the exception's type only."""
    for kind_type, kind in _KINDS:
        if isinstance(exc, kind_type):
            return kind
    return "internal_error"


def _peer(record: logging.LogRecord) -> str:
    """The peer address aiohttp passed (``Error handling request from %s``), if
    it is an IP address; never any other argument."""
    args = record.args if isinstance(record.args, tuple) else ()
    if not (args and isinstance(record.msg, str) and record.msg.endswith("from %s")):
        return "-"
    try:
        return str(ipaddress.ip_address(str(args[0])))
    except ValueError:
        return "-"


class ClientErrorFilter(logging.Filter):
    """Rewrites the HTTP server's error records to kind and peer; rate-limits them.

    (Counting is not done here: a record below the log level is never made.
    ``serving/server.py`` counts every rejected request in the connection
    handler.)
    """

    def __init__(self, *, burst: int = 5, interval_s: float = 60.0):
        super().__init__()
        self.limiter = RateLimited(logging.getLogger(__name__), burst=burst, interval_s=interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            # aiohttp's own fixed texts (lingering close, premature disconnection).
            return True
        kind = error_kind(exc)
        peer = _peer(record)
        # Nothing of the original record survives but its level and logger.
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        left_out = self.limiter.allow(kind)
        if left_out is None:
            return False
        if kind == "internal_error":
            record.msg = "request from %s failed in the proxy (%s: a bug)"
            record.args = (peer, type(exc).__name__)
        else:
            record.msg = "request from %s rejected by the HTTP parser: %s"
            record.args = (peer, kind)
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        if left_out:
            record.msg += " (%d similar lines left out)"
            record.args = (*record.args, left_out)
        return True


def guard_server_logging(logger: logging.Logger) -> ClientErrorFilter:
    """Install one ``ClientErrorFilter`` on ``logger`` and on ``aiohttp.server``."""
    guard = ClientErrorFilter()
    for target in (logger, logging.getLogger("aiohttp.server")):
        for old in [f for f in target.filters if isinstance(f, ClientErrorFilter)]:
            target.removeFilter(old)
        target.addFilter(guard)
    return guard
