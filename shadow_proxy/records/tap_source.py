"""Records from a live tap over ZeroMQ: a SUB socket on the tap's topic and its
heartbeat topic, with CURVE when the tap has it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from shadow_proxy.records import wire
from shadow_proxy.records.delivery import Delivery, RecordSource
from shadow_proxy.records.errors import SourceError


class TapSource(RecordSource):
    """A live tap: a ZeroMQ SUB socket on one topic (and its heartbeats)."""

    live = True

    def __init__(
        self,
        endpoints: Sequence[str],
        topic: str,
        *,
        rcvhwm: int = 100_000,
        max_message_bytes: int = 256 * 2**20,
        curve: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``curve``: (the tap's public key file, this consumer's key pair file)
        for a tap with CURVE (``zmq.auth.create_certificates`` files)."""
        super().__init__(**kwargs)
        import zmq
        import zmq.asyncio

        self.endpoints = list(endpoints)
        self.topic = topic
        self._topic = topic.encode("utf-8")
        self._heartbeat_topic = wire.heartbeat_topic(topic).encode("utf-8")
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, rcvhwm)
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        socket.setsockopt(zmq.SUBSCRIBE, self._topic)
        socket.setsockopt(zmq.SUBSCRIBE, self._heartbeat_topic)
        if curve is not None:
            _curve_client(socket, *curve)
        for endpoint in self.endpoints:
            socket.connect(endpoint)
        self._socket = socket

    def describe(self) -> str:
        return f"topic {self.topic} at {','.join(self.endpoints)}"

    async def deliveries(self) -> AsyncIterator[Delivery]:
        where = ",".join(self.endpoints)
        while True:
            frames = await self._socket.recv_multipart()
            # Subscriptions match by prefix: compare the topic frame exactly.
            topic = bytes(frames[0]) if frames else b""
            if topic not in (self._topic, self._heartbeat_topic):
                self.stats.reject("topic")
                continue
            try:
                message = wire.decode_frames(frames)
            except wire.WireError as e:
                self.stats.reject(e.reason, sum(map(len, frames)))
                continue
            if topic == self._topic:
                delivery = self._record(message, where)
            else:
                delivery = self._heartbeat(message, where)
            if delivery is not None:
                yield delivery

    async def aclose(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
            self._context.term()


def _curve_client(socket: Any, server_key: str, client_key: str) -> None:
    """Make ``socket`` a CURVE client of the tap whose public key is in
    ``server_key``, with the key pair in ``client_key``; ``SourceError`` when a
    file cannot be used."""
    import zmq
    import zmq.auth

    try:
        server_public, _ = zmq.auth.load_certificate(server_key)
        public, secret = zmq.auth.load_certificate(client_key)
    except (OSError, ValueError) as e:
        msg = f"CURVE key file: {e}"
        raise SourceError(msg) from e
    if not secret:
        msg = f"--curve-client-key {client_key} holds no secret-key (use the .key_secret file)"
        raise SourceError(msg)
    socket.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
