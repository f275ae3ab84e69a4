"""``sockets.ack_now``: quick-ACK mode on a TCP socket, nothing elsewhere."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from shadow_proxy.sockets import ack_now


class Connection:
    def __init__(self, transport: asyncio.Transport | None) -> None:
        self.transport = transport


async def _pair(family: int) -> tuple[asyncio.Transport, socket.socket]:
    server, peer = socket.socketpair(family) if family == socket.AF_UNIX else _tcp_pair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, server)
    return transport, peer


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return server, client


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_QUICKACK is Linux's")
async def test_tcp_socket_leaves_delayed_ack_mode() -> None:
    transport, peer = await _pair(socket.AF_INET)
    sock = transport.get_extra_info("socket")
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
        ack_now(Connection(transport))
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
    finally:
        transport.close()
        peer.close()


async def test_no_connection_unix_socket_and_closed_transport_are_no_ops() -> None:
    ack_now(None)
    ack_now(Connection(None))
    transport, peer = await _pair(socket.AF_UNIX)
    try:
        ack_now(Connection(transport))
    finally:
        transport.close()
        peer.close()
    await asyncio.sleep(0)
    ack_now(Connection(transport))
