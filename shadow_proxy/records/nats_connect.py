"""A NATS connection for a reader or the proxy: within a budget, with the
refusals told apart from outages, and without tracebacks (issue 31).

``connect`` tries the servers until one accepts, for at most ``budget_s``:

- a server that refuses (authorization violation, TLS verification failed,
  permissions violation) raises ``NatsRefused`` at once, its one line naming the
  cause: trying again would not help;
- no server answering within the budget raises ``NatsUnreachable``, one line;
- once connected, the client reconnects for ever (to any server of the
  cluster) and ``Outages`` says so on ``log``: one line when the connection is
  lost, one when it is back; never a traceback, never a URL's userinfo.

``cause`` is the one-line reason of a refusal (None for what is transient), for
the proxy's publisher too, which keeps serving and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import nats
import nats.aio.client
import nats.errors

from shadow_proxy.records.errors import NatsRefused, NatsUnreachable
from shadow_proxy.records.nats_access import NatsAccess, redact, redact_all

Log = Callable[[str], None]


def cause(error: BaseException) -> str | None:
    """The refusal an error is, in a few words; None when it is an outage."""
    text = str(error)
    lowered = text.lower()
    if isinstance(error, nats.errors.AuthorizationError) or "authorization violation" in lowered:
        return "authorization violation (wrong or missing credentials)"
    if "authentication" in lowered and "expired" in lowered:
        return "authorization violation (expired credentials)"
    if isinstance(error, ssl.SSLCertVerificationError) or "certificate verify failed" in lowered:
        reason = getattr(error, "verify_message", None) or "certificate verify failed"
        return f"TLS verification failed ({reason})"
    if isinstance(error, ssl.SSLError):
        return f"TLS failed ({getattr(error, 'reason', None) or type(error).__name__})"
    if "permissions violation" in lowered:
        detail = text.split("nats:", 1)[-1].strip().strip("'")
        return f"permissions violation: {detail}"
    if "tls" in lowered and "required" in lowered:
        return "the server requires TLS (give a CA file, or a tls:// URL)"
    return None


class _Quiet(logging.Filter):
    """asyncio's ``returning true from eof_received() has no effect when using
    ssl``, which it logs for every TLS connection the NATS client makes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received" not in record.getMessage()


_QUIET = _Quiet()


def quiet_asyncio() -> None:
    logger = logging.getLogger("asyncio")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


class Outages:
    """The client's callbacks: one line per outage on ``log``, the last refusal kept
    (a permissions violation comes asynchronously, after the request it refused)."""

    def __init__(self, what: str, log: Log | None) -> None:
        self.what = what
        self.log = log
        self.down = False
        #: A refusal seen since connecting (a reader stops on it).
        self.refusal: str | None = None
        self.errors = 0
        #: Whether the first connection was made (failed attempts before it are not outages).
        self.armed = False
        self.client: nats.aio.client.Client | None = None

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    async def error(self, error: Exception) -> None:
        """Kept, not said: the reader stops on a refusal with its own line."""
        self.errors += 1
        refusal = cause(error)
        if refusal is not None:
            self.refusal = refusal

    async def disconnected(self) -> None:
        if self.armed and not self.down:
            self.down = True
            self.say(f"{self.what}: NATS connection lost; reconnecting")

    async def reconnected(self) -> None:
        if self.down and self.client is not None:
            self.down = False
            url = self.client.connected_url
            where = redact(url.geturl()) if url is not None else "a server"
            self.say(f"{self.what}: NATS connection back ({where})")


async def connect(
    servers: Sequence[str],
    access: NatsAccess,
    *,
    name: str,
    budget_s: float,
    log: Log | None = None,
    **options: Any,
) -> tuple[nats.aio.client.Client, Outages]:
    """A connected client and its ``Outages``; ``NatsRefused`` or ``NatsUnreachable``."""
    quiet_asyncio()
    outages = Outages(name, log)
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def first_error(error: Exception) -> None:
        refusal = cause(error)
        if refusal is not None and not refused.done():
            refused.set_result(refusal)

    client = outages.client = nats.aio.client.Client()
    attempt = asyncio.ensure_future(
        client.connect(
            servers=list(servers),
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            error_cb=first_error,
            disconnected_cb=outages.disconnected,
            reconnected_cb=outages.reconnected,
            **{"reconnect_time_wait": 0.5, "connect_timeout": 2, **options},
            **access.connect_options(),
        )
    )
    where = redact_all(list(servers))
    waits: set[asyncio.Future[Any]] = {attempt, refused}
    done, _ = await asyncio.wait(waits, timeout=budget_s, return_when="FIRST_COMPLETED")
    if attempt in done and attempt.exception() is None:
        client._error_cb = outages.error  # from now on: one line per refusal, no traceback
        outages.armed = True
        return client, outages
    attempt.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await attempt
    with contextlib.suppress(Exception):
        await client.close()
    if refused.done():
        msg = f"NATS at {where} refused {name} ({access.describe()}): {refused.result()}"
        raise NatsRefused(msg)
    error = attempt.exception() if attempt in done else None
    if error is not None:
        msg = f"NATS at {where}: {cause(error) or type(error).__name__} ({name})"
        raise NatsRefused(msg)
    msg = f"no NATS server answered at {where} within {budget_s:g} s ({name})"
    raise NatsUnreachable(msg)
