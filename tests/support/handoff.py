"""The worker's end of the hand-off, played by a plain Unix socket: the tests of
the serving side read what the worker would (``channel.frames`` messages)."""

from __future__ import annotations

import socket

from shadow_proxy.channel import frames as hf


class HandoffReader:
    """Connects to the hand-off's path; ``read`` returns every message so far."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.decoder = hf.StreamDecoder()
        self.messages: list[list[bytes]] = []

    def read(self) -> list[list[bytes]]:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return self.messages
            if not data:
                return self.messages
            self.messages += [hf.split_frames(m) for m in self.decoder.feed(data)]

    def close(self) -> None:
        self.sock.close()
