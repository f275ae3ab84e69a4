"""The worker decodes its own copy of an encoded request body, bounded (issue 17 item 1),
and reads it with msgspec first exactly as ``json.loads`` would (``parse_body``)."""

from __future__ import annotations

import gzip
import json
import math
import struct
import time
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.worker.request.body import decode_body, parse_body
from shadow_proxy.worker.request.fields import Reject, reject_constant

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


# -- parse_body: msgspec first, exactly json.loads ------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


def general(body: bytes) -> Any:
    """The reference: UTF-8 text through ``json.loads`` (what ``parse_body`` did
    alone before msgspec)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "non_utf8"
    try:
        obj = json.loads(text, parse_constant=reject_constant)
    except (ValueError, Reject):
        return "invalid_json"
    return obj if isinstance(obj, dict) else "not_an_object"


def exact(value: Any) -> Any:
    """``value`` with each float as its bits and each type named: ``1 == 1.0`` and
    ``0.0 == -0.0`` would hide a difference."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value) if not math.isnan(value) else "nan")
    if isinstance(value, dict):
        return ("dict", [(k, exact(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [exact(v) for v in value])
    return (type(value).__name__, value)


def parsed(body: bytes) -> Any:
    try:
        return parse_body(body)
    except Reject as reject:
        return getattr(reject.reason, "value", reject.reason)


@settings(max_examples=400)
@given(obj=st.dictionaries(st.text(max_size=6), values, max_size=5), ascii=st.booleans())
def test_same_as_json_loads(obj: dict[str, Any], ascii: bool) -> None:
    body = json.dumps(obj, ensure_ascii=ascii).encode()
    assert exact(parsed(body)) == exact(general(body))


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1e400}',  # msgspec refuses; json.loads reads inf
        b'{"a": NaN}',
        b'{"a": "\\ud800"}',  # a lone surrogate: serde refuses it
        b'{"a": "\\ud83d\\ude00"}',  # a pair: one character
        b'{"a": "\xff"}',
        b"\xef\xbb\xbf{}",
        b"[1]",
        b'{"a": 1, "a": 2}',
        b'{"a": 12345678901234567890123456789}',
        b'{"a": -0.0, "b": 1E5, "c": 5e-324}',
        b"{} x",
    ],
)
def test_edge_bodies(body: bytes) -> None:
    want = general(body)
    if want != "invalid_json" and b"\\ud800" in body:
        want = "invalid_json"  # the lone-surrogate check of the general path
    assert exact(parsed(body)) == exact(want)
