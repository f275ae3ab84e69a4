"""The link's lost-connection line: the cause in words beside the client's class
name (it said only 'connection: UnexpectedEOF' when a node was killed), a
refusal counted apart, and one line per cause every ``LOG_EVERY_S``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import nats.errors
import pytest

from shadow_proxy.worker.main.publishers.jetstream import LOST, JetStreamLink
from tests.support.jetstream import nats_tap_config as config


@pytest.fixture
def link() -> Iterator[JetStreamLink]:
    """A link whose thread is not started: the test calls its error callback."""
    made = JetStreamLink(config(["nats://127.0.0.1:9"]).nats)
    yield made
    made.loop.close()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("JetStream:")]


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (nats.errors.UnexpectedEOF(), "the server closed the connection (UnexpectedEOF)"),
        (ConnectionResetError(), "the server reset the connection (ConnectionResetError)"),
        (ConnectionRefusedError(), "no server listening at the address (ConnectionRefusedError)"),
        (nats.errors.StaleConnectionError(), "stopped answering pings (StaleConnectionError)"),
        (ValueError("x"), "no cause given (ValueError)"),
    ],
)
def test_lost_connection_says_its_cause(
    link: JetStreamLink, caplog: pytest.LogCaptureFixture, error: Exception, said: str
) -> None:
    with caplog.at_level(logging.WARNING):
        asyncio.run(link._on_error(error))
    (line,) = lines(caplog)
    assert line.startswith("JetStream: connection lost, reconnecting: ") and line.endswith(said)
    assert link.stats.refusals == 0


def test_every_cause_is_a_client_error_name() -> None:
    """The map's keys are class names the client or the socket raises (a typo
    would never match)."""
    import builtins

    for name in LOST:
        assert hasattr(nats.errors, name) or hasattr(builtins, name), name


def test_a_refusal_is_counted_and_said_once_per_period(
    link: JetStreamLink, caplog: pytest.LogCaptureFixture
) -> None:
    refused = nats.errors.Error("nats: 'Authorization Violation'")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            asyncio.run(link._on_error(refused))
    assert link.stats.refusals == 3
    (line,) = lines(caplog)
    assert line == "JetStream: refused: authorization violation (wrong or missing credentials)"
