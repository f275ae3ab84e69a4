"""Operator log lines: rate-limited, and the server's client errors reduced to
kind and peer (serving/logs.py; issue 17 item 12, issue 18 item 2)."""

from __future__ import annotations

import logging

from aiohttp import http_exceptions as hx

from shadow_proxy.serving.logs import ClientErrorFilter, RateLimited, error_kind


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestRateLimited:
    """``burst`` lines per key and window, then the count of lines left out."""

    def test_burst_then_silence_then_the_count(self, caplog):
        clock = Clock()
        limited = RateLimited(logging.getLogger("t"), burst=3, interval_s=60, clock=clock)
        with caplog.at_level(logging.INFO, logger="t"):
            logged = [limited.log("k", logging.WARNING, "event %d", i) for i in range(10)]
            assert logged == [True] * 3 + [False] * 7
            clock.now = 61
            assert limited.log("k", logging.WARNING, "event %d", 10)
        messages = [r.getMessage() for r in caplog.records]
        assert messages[:3] == ["event 0", "event 1", "event 2"]
        assert messages[3] == "event 10 (7 similar lines left out)"

    def test_keys_are_independent(self):
        limited = RateLimited(logging.getLogger("t"), burst=1, interval_s=60, clock=Clock())
        assert limited.allow("a") == 0
        assert limited.allow("a") is None
        assert limited.allow("b") == 0


class TestClientErrorFilter:
    """A record with an exception keeps kind and peer only."""

    def record(self, exc: BaseException, *args: object) -> logging.LogRecord:
        try:
            raise exc
        except BaseException as e:
            info = (type(e), e, e.__traceback__)
        return logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            args,
            info,
        )

    def test_rewrites_to_kind_and_peer(self):
        record = self.record(hx.InvalidHeader(b"Authorization: sk-SECRET\x01"), "10.0.0.7")
        assert ClientErrorFilter().filter(record)
        text = logging.Formatter().format(record)
        assert "sk-SECRET" not in text
        assert text == "request from 10.0.0.7 rejected by the HTTP parser: bad_header"
        assert record.levelname == "WARNING"

    def test_a_peer_that_is_not_an_address_is_not_logged(self):
        record = self.record(hx.BadStatusLine("x"), "sk-SECRET")
        ClientErrorFilter().filter(record)
        assert "sk-SECRET" not in record.getMessage()

    def test_kinds_come_from_types(self):
        assert error_kind(hx.LineTooLong("x", "8190")) == "too_long"
        assert error_kind(hx.TransferEncodingError("sk")) == "bad_body"
        assert error_kind(ValueError("sk")) == "internal_error"
