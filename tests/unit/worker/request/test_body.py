"""The worker decodes its own copy of an encoded request body, bounded (issue 17 item 1)."""

from __future__ import annotations

import gzip
import time
import zlib

import pytest

from shadow_proxy.worker.request.body import decode_body
from shadow_proxy.worker.request.fields import Reject

TEXT = b'{"model":"m","prompt":"' + b"abc" * 1000 + b'"}'


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


class TestDecodes:
    """Each supported encoding gives the bytes back exactly."""

    @pytest.mark.parametrize(
        ("encoding", "body"),
        [
            ("gzip", gzip.compress(TEXT, mtime=0)),
            ("x-gzip", gzip.compress(TEXT, mtime=0)),
            ("GZip", gzip.compress(TEXT, mtime=0)),
            ("deflate", zlib.compress(TEXT)),
            ("deflate", raw_deflate(TEXT)),  # what some clients call deflate
            ("identity", TEXT),
            ("gzip, deflate", zlib.compress(gzip.compress(TEXT, mtime=0))),  # applied in order
            (
                "gzip",
                gzip.compress(TEXT[:100], mtime=0) + gzip.compress(TEXT[100:], mtime=0),
            ),  # two members
        ],
    )
    def test_round_trip(self, encoding, body):
        assert decode_body(body, encoding, len(TEXT)) == TEXT


class TestRefuses:
    """Anything else is a counted reason, never an exception or unbounded work."""

    @pytest.mark.parametrize(
        ("encoding", "body"),
        [
            ("br", b"\x8b\x02\x80hello\x03"),
            ("zstd", b"(\xb5/\xfd"),
            ("gzip", b"not gzip"),
            ("gzip", gzip.compress(TEXT, mtime=0)[:-20]),  # truncated
            ("deflate", b"\x00\x01garbage"),
        ],
    )
    def test_content_encoding(self, encoding, body):
        with pytest.raises(Reject) as info:
            decode_body(body, encoding, 10 * len(TEXT))
        assert info.value.reason == "content_encoding"

    def test_exactly_the_limit_passes_one_more_byte_does_not(self):
        body = gzip.compress(TEXT, mtime=0)
        assert decode_body(body, "gzip", len(TEXT)) == TEXT
        with pytest.raises(Reject) as info:
            decode_body(body, "gzip", len(TEXT) - 1)
        assert info.value.reason == "body_too_large"

    def test_identity_over_the_limit(self):
        with pytest.raises(Reject) as info:
            decode_body(TEXT, "identity", len(TEXT) - 1)
        assert info.value.reason == "body_too_large"

    def test_a_bomb_stops_at_the_bound(self):
        """256 MiB of zeros in 256 KB of gzip: decoding stops one byte past 1 MiB."""
        compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        chunk = bytes(1 << 20)
        bomb = b"".join(compressor.compress(chunk) for _ in range(256)) + compressor.flush()
        started = time.process_time()
        with pytest.raises(Reject) as info:
            decode_body(bomb, "gzip", 1 << 20)
        assert info.value.reason == "body_too_large"
        # Decoding all 256 MiB takes about a second; one MiB, milliseconds.
        assert time.process_time() - started < 0.5
