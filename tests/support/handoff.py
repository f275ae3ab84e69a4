"""The worker's end of the hand-off, played by a plain Unix socket: the tests of
the serving side read what the worker would (``channel.handoff`` messages, decoded)."""

from __future__ import annotations

import socket

from shadow_proxy.channel import handoff
from shadow_proxy.channel.stream import StreamDecoder, split_frames


class HandoffReader:
    """Connects to the hand-off's path; ``read`` returns every message so far."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.decoder = StreamDecoder()
        self.messages: list[handoff.HandoffMessage] = []

    def read(self) -> list[handoff.HandoffMessage]:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return self.messages
            if not data:
                return self.messages
            self.messages += [handoff.decode(split_frames(m)) for m in self.decoder.feed(data)]

    def close(self) -> None:
        self.sock.close()
