"""Hand-off messages on a byte stream: framed, cut back exactly, however the bytes arrive."""

from __future__ import annotations

import random
from typing import ClassVar

from shadow_proxy.channel import frames as hf


def message(kind: bytes, key: int, *frames: bytes) -> list[bytes]:
    return [kind + hf.KEY.pack(key), *frames]


def encoded(frames: list[bytes]) -> bytes:
    buffers, size = hf.stream_buffers(frames)
    data = b"".join(buffers)
    assert len(data) == size
    return data


class TestStreamFraming:
    """Each message comes back with its frames, whatever the read boundaries."""

    MESSAGES: ClassVar[list[list[bytes]]] = [
        message(hf.KIND_REQUEST, 1, b"meta", b"request-id", b'{"model":"m"}'),
        message(hf.KIND_CHUNK, 1, b"", b"\x00" * 12, b"data: x\n\n"),
        message(hf.KIND_END, 1, b"", b"", b"", b""),
        message(hf.KIND_REQUEST, 2, b"", b"", b"x" * 70_000),
        [hf.LAST_MESSAGE],
    ]

    def test_byte_by_byte_and_random_cuts(self):
        stream = b"".join(encoded(m) for m in self.MESSAGES)
        rng = random.Random(7)
        for cuts in ([1] * 200, None):
            decoder = hf.StreamDecoder()
            got, pos = [], 0
            while pos < len(stream):
                n = cuts.pop() if cuts else rng.randint(1, 9000)
                got += decoder.feed(stream[pos : pos + n])
                pos += n
            assert [hf.split_frames(m) for m in got] == self.MESSAGES
            assert decoder.pending_bytes == 0

    def test_incomplete_message_is_held(self):
        data = encoded(self.MESSAGES[0])
        decoder = hf.StreamDecoder()
        assert decoder.feed(data[:-1]) == []
        assert decoder.pending_bytes == len(data) - 1
        assert decoder.feed(data[-1:]) == [data]

    def test_peek_reads_kind_and_key_without_splitting(self):
        data = encoded(message(hf.KIND_END, 2**40 + 3, b"m", b"x"))
        assert hf.peek(data) == (hf.KIND_END, hf.KEY.pack(2**40 + 3))

    def test_forwarded_message_is_the_same_bytes(self):
        """A decoded message is the encoded bytes, length included: forwarding is a copy."""
        data = encoded(self.MESSAGES[1])
        assert hf.StreamDecoder().feed(data + data[:5]) == [data]


class TestConsume:
    """A partial send removes exactly the bytes sent; empty frames never stall a writer."""

    def test_partial_sends_of_a_message_with_empty_frames(self):
        frames = message(hf.KIND_END, 5, b"", b"", b"abc", b"")
        buffers, size = hf.stream_buffers(frames)
        assert all(buffers), "an empty buffer would make a writer send 0 bytes forever"
        whole = b"".join(buffers)
        sent = b""
        for _ in range(size + 1):
            if not buffers:
                break
            n = min(3, len(b"".join(buffers)))
            sent += b"".join(buffers)[:n]
            hf.consume(buffers, n)
        assert buffers == []
        assert sent == whole
        assert hf.split_frames(whole) == frames
