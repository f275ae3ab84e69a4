"""Refusals told apart from outages; an unreachable server within the budget."""

from __future__ import annotations

import ssl
import time

import nats.errors
import pytest

from shadow_proxy.devtools.processes import reserve_port
from shadow_proxy.records import nats_connect
from shadow_proxy.records.errors import NatsUnreachable
from shadow_proxy.records.nats_access import NatsAccess


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (nats.errors.Error("nats: 'Authorization Violation'"), "authorization violation"),
        (nats.errors.AuthorizationError(), "authorization violation"),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), "TLS verification failed"),
        (
            nats.errors.Error("nats: 'Permissions Violation for Publish to \"shadow.x\"'"),
            'permissions violation: Permissions Violation for Publish to "shadow.x"',
        ),
        (nats.errors.TimeoutError(), None),
        (ConnectionRefusedError(), None),
    ],
)
def test_cause(error: BaseException, cause: str | None) -> None:
    found = nats_connect.cause(error)
    assert found == cause if cause is None else (found or "").startswith(cause)


async def test_unreachable_within_the_budget() -> None:
    """An unreachable server was 21-24 raw tracebacks in 12 s and no exit."""
    lines: list[str] = []
    url = f"nats://user:hidden@127.0.0.1:{reserve_port()}"
    started = time.monotonic()
    with pytest.raises(NatsUnreachable, match="no NATS server answered") as caught:
        await nats_connect.connect(
            [url], NatsAccess(), name="reader", budget_s=1.0, log=lines.append
        )
    assert time.monotonic() - started < 5
    assert "hidden" not in str(caught.value) and "127.0.0.1" in str(caught.value)
    assert lines == []


def test_asyncio_tls_eof_line_filtered() -> None:
    import logging

    nats_connect.quiet_asyncio()
    record = logging.LogRecord(
        "asyncio",
        logging.WARNING,
        "",
        0,
        "returning true from eof_received() has no effect when using ssl",
        None,
        None,
    )
    assert not logging.getLogger("asyncio").filter(record)
