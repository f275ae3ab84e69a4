"""Socket options the HTTP clients set per response (the serving loop's client
to the frontend, and the replayer's).

A frontend that writes its response without ``TCP_NODELAY`` (Dynamo 1.6.1's
HTTP listener does so) holds its first body bytes back until the response
headers are acknowledged (Nagle). On a kept-alive connection Linux delays that
acknowledgement (delayed ACK, 40 ms at least), because the connection looks
interactive: the receiver sent a request just before. A client on a fresh
connection is in quick-ACK mode and never sees the stall, so without this a
client that opens a connection per request would get its first token about
35 ms later through the proxy's pooled connections than from the frontend
directly (measured on Dynamo 1.6.1: 49 ms against 15 ms).

``ack_now`` asks the kernel to acknowledge what has arrived at once and to
stay in quick-ACK mode until this side sends again (``TCP_QUICKACK``, Linux
only; a no-op elsewhere and on sockets that are gone): one ``setsockopt``
call per response, no read or copy of data.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class HasTransport(Protocol):
    """An HTTP client's connection (``aiohttp``'s ``ClientResponse.connection``)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...


def ack_now(connection: HasTransport | None) -> None:
    """Acknowledge at once what ``connection``'s TCP socket received (see above)."""
    transport = connection.transport if connection is not None else None
    if _QUICKACK is None or transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    except OSError:
        pass  # not TCP (a Unix socket), or already closed
