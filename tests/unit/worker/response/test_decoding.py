"""Content-Encoding undone incrementally and in bounded steps."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

import pytest

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response import decoding
from shadow_proxy.worker.response.recorder import ResponseRecorder
from tests.support.responses import (
    CHAT_STREAM,
    JSON,
    SSE,
    comp,
    observe,
    record,
)


class TestEncodings:
    """gzip and deflate bodies decode incrementally; bombs stay bounded."""

    def test_gzip_stream(self) -> None:
        raw = b"".join(CHAT_STREAM)
        packed = gzip.compress(raw, mtime=0)
        obs = observe(*(packed[i : i + 7] for i in range(0, len(packed), 7)), encoding="gzip")
        timing = ("first_token_offset_ns", "last_token_offset_ns", "chunk_offsets_ns")
        rec = {k: v for k, v in record(obs).items() if k not in timing}
        plain = {k: v for k, v in record(observe(raw)).items() if k not in timing}
        assert rec == plain
        assert rec["outcome"] == "complete"

    def test_gzip_with_several_members(self) -> None:
        raw = b"".join(CHAT_STREAM)
        packed = gzip.compress(raw[:100], mtime=0) + gzip.compress(raw[100:], mtime=0)
        obs = observe(packed[:50], packed[50:], encoding="gzip")
        assert obs.outcome == "complete"
        assert obs.choices[0].text == "Hello wörld"

    @pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
    def test_deflate_unary_zlib_or_raw(self, wbits: int) -> None:
        body = json.dumps(comp("hello", finish="stop")).encode()
        packer = zlib.compressobj(wbits=wbits)
        packed = packer.compress(body) + packer.flush()
        obs = observe(
            packed[:1], packed[1:], route=Route.COMPLETIONS, ctype=JSON, encoding="deflate"
        )
        assert obs.outcome == "complete"
        assert obs.choices[0].text == "hello"

    def test_gzip_bomb_is_cut_at_the_unary_cap(self) -> None:
        packed = gzip.compress(b" " * (8 << 20), mtime=0)
        obs = observe(packed, ctype=JSON, encoding="gzip", max_unary_bytes=1 << 20)
        assert obs.body_problem == f"body over {1 << 20} bytes"

    def test_decompression_is_stepwise(self) -> None:
        """A small compressed chunk never expands into one huge buffer."""
        packed = gzip.compress(b"data: " + b"x" * (32 << 20), mtime=0)  # one 32 MiB line
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_event_bytes=1 << 20)
        recorder.head(200, SSE, "gzip", 0)
        tracemalloc.start()
        try:
            recorder.feed(packed, 1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2 << 20
        observed = recorder.finish(EndKind.CLEAN, 2)
        assert observed.outcome == "incomplete"
        assert observed.truncated_events == 1


class TestBodyDecoder:
    """Called directly: the header decides the decoder; output in bounded pieces."""

    @pytest.mark.parametrize(
        ("header", "kind"),
        [
            ("", "identity"),
            ("identity", "identity"),
            ("gzip", "gzip"),
            ("x-gzip", "gzip"),
            ("Deflate", "deflate"),
            (" gzip , identity", "gzip"),
            ("br", "br"),
            ("zstd", "zstd"),
        ],
    )
    def test_for_header(self, header: str, kind: str) -> None:
        decoder = decoding.for_header(header)
        assert decoder is not None and decoder.kind == kind

    @pytest.mark.parametrize("header", ["gzip, gzip", "br, gzip", "compress", "exi"])
    def test_unknown_encodings_are_not_decoded(self, header: str) -> None:
        assert decoding.for_header(header) is None

    def test_identity_passes_through(self) -> None:
        assert list(decoding.BodyDecoder("identity").decode(b"abc")) == [b"abc"]

    def test_a_bomb_comes_out_in_steps(self) -> None:
        data = gzip.compress(b"\0" * (5 * decoding.DECODE_STEP), mtime=0)
        pieces = list(decoding.for_header("gzip").decode(data))
        assert all(len(p) <= decoding.DECODE_STEP for p in pieces)
        assert sum(map(len, pieces)) == 5 * decoding.DECODE_STEP

    def test_deflate_with_a_one_byte_first_chunk(self) -> None:
        data = zlib.compress(b"hello deflate")
        decoder = decoding.for_header("deflate")
        assert list(decoder.decode(data[:1])) == []  # the header is not known yet
        assert b"".join(decoder.decode(data[1:])) == b"hello deflate"

    def test_corrupt_input_raises_decode_error(self) -> None:
        with pytest.raises(decoding.DecodeError):
            list(decoding.for_header("gzip").decode(b"\x1f\x8bnot gzip at all"))
