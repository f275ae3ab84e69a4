"""Messages on a byte stream: framed, cut back exactly, however the bytes arrive."""

from __future__ import annotations

import random
from typing import ClassVar

from shadow_proxy.channel.stream import (
    StreamDecoder,
    consume,
    frame_at,
    split_frames,
    stream_buffers,
    stream_message,
)


def encoded(frames: list[bytes]) -> bytes:
    buffers, size = stream_buffers(frames)
    data = b"".join(buffers)
    assert len(data) == size
    assert data == stream_message(frames)
    return data


class TestStreamFraming:
    """Each message comes back with its frames, whatever the read boundaries."""

    MESSAGES: ClassVar[list[list[bytes]]] = [
        [b"q" + b"\x00" * 7 + b"\x01", b"meta", b"request-id", b'{"model":"m"}'],
        [b"c" + b"\x00" * 7 + b"\x01", b"", b"\x00" * 12, b"data: x\n\n"],
        [b"e" + b"\x00" * 7 + b"\x01", b"", b"", b"", b""],
        [b"q" + b"\x00" * 7 + b"\x02", b"", b"", b"x" * 70_000],
        [b"z" + b"\x00" * 8],
    ]

    def test_byte_by_byte_and_random_cuts(self):
        stream = b"".join(encoded(m) for m in self.MESSAGES)
        rng = random.Random(7)
        for cuts in ([1] * 200, None):
            decoder = StreamDecoder()
            got, pos = [], 0
            while pos < len(stream):
                n = cuts.pop() if cuts else rng.randint(1, 9000)
                got += decoder.feed(stream[pos : pos + n])
                pos += n
            assert [split_frames(m) for m in got] == self.MESSAGES
            assert decoder.pending_bytes == 0

    def test_whole_messages_are_not_copied(self):
        """A read that is one whole message is that message (no copy); whole ones
        and the start of the next are cut as they are, the start kept."""
        one, two = encoded(self.MESSAGES[0]), encoded(self.MESSAGES[1])
        decoder = StreamDecoder()
        assert decoder.feed(one)[0] is one
        got = decoder.feed(one + two[:5])
        assert got == [one] and decoder.pending_bytes == 5
        assert decoder.feed(two[5:]) == [two] and decoder.pending_bytes == 0

    def test_incomplete_message_is_held(self):
        data = encoded(self.MESSAGES[0])
        decoder = StreamDecoder()
        assert decoder.feed(data[:-1]) == []
        assert decoder.pending_bytes == len(data) - 1
        assert decoder.feed(data[-1:]) == [data]

    def test_forwarded_message_is_the_same_bytes(self):
        """A decoded message is the encoded bytes, length included: forwarding is a copy."""
        data = encoded(self.MESSAGES[1])
        assert StreamDecoder().feed(data + data[:5]) == [data]


class TestFrameAt:
    """One frame of a stream message, read by skipping the ones before."""

    def test_each_frame_and_past_the_end(self):
        frames = [b"q" + b"k" * 8, b"rid", b"body" * 1000, b"x-session-id:s\n", b""]
        message = encoded(frames)
        assert [frame_at(message, i) for i in range(5)] == frames
        assert frame_at(message, 5) is None
        assert frame_at(message[:-4], 4) is None  # cut short


class TestConsume:
    """A partial send removes exactly the bytes sent; empty frames never stall a writer."""

    def test_partial_sends_of_a_message_with_empty_frames(self):
        frames = [b"e" + b"\x00" * 8, b"", b"", b"abc", b""]
        buffers, size = stream_buffers(frames)
        assert all(buffers), "an empty buffer would make a writer send 0 bytes forever"
        whole = b"".join(buffers)
        sent = b""
        for _ in range(size + 1):
            if not buffers:
                break
            n = min(3, len(b"".join(buffers)))
            sent += b"".join(buffers)[:n]
            consume(buffers, n)
        assert buffers == []
        assert sent == whole
        assert split_frames(whole) == frames
