"""br and zstd bodies decode incrementally, in pieces of at most DECODE_STEP bytes."""

from __future__ import annotations

import tracemalloc

import brotli
import pytest
import zstandard

from shadow_proxy.worker.response.decoding import DECODE_STEP, DecodeError, for_header

BODY = b"".join(b'data: {"n": %d, "text": "w\xc3\xb6rld"}\n\n' % i for i in range(3000))


def compress(encoding: str, data: bytes) -> bytes:
    if encoding == "br":
        return brotli.compress(data)
    return zstandard.ZstdCompressor().compress(data)


def decode_all(encoding: str, data: bytes, split: int) -> list[bytes]:
    decoder = for_header(encoding)
    return [p for i in range(0, len(data), split) for p in decoder.decode(data[i : i + split])]


class TestRoundTrip:
    @pytest.mark.parametrize("encoding", ["br", "zstd", " ZSTD ", "BR"])
    @pytest.mark.parametrize("split", [1, 7, 4096, 10**9])
    def test_any_split(self, encoding: str, split: int) -> None:
        data = compress(encoding.strip().lower(), BODY)
        assert b"".join(decode_all(encoding, data, split)) == BODY

    def test_zstd_frames_one_after_another(self) -> None:
        data = compress("zstd", BODY[:1000]) + compress("zstd", BODY[1000:])
        assert b"".join(decode_all("zstd", data, 333)) == BODY


class TestBounded:
    @pytest.mark.parametrize("encoding", ["br", "zstd"])
    def test_bomb_in_small_pieces(self, encoding: str) -> None:
        """64 MiB from a few KiB: pieces of DECODE_STEP, and never more than a
        few DECODE_STEPs held at once (traced allocations)."""
        bomb = compress(encoding, b"\0" * (64 << 20))
        assert len(bomb) < 64 * 1024
        decoder = for_header(encoding)
        total = largest = 0
        tracemalloc.start()
        try:
            for piece in decoder.decode(bomb):
                total += len(piece)
                largest = max(largest, len(piece))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert total == 64 << 20
        assert largest <= DECODE_STEP
        assert peak < 8 * DECODE_STEP


class TestCorrupt:
    @pytest.mark.parametrize("encoding", ["br", "zstd"])
    def test_corrupt_raises_decode_error(self, encoding: str) -> None:
        with pytest.raises(DecodeError):
            decode_all(encoding, b"\xff" * 64 + compress(encoding, BODY), 4096)
