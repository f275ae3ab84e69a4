"""Hop-by-hop filtering (RFC 9110 section 7.6.1) and request ids, both directions."""

from __future__ import annotations

import re

from multidict import CIMultiDict, CIMultiDictProxy

from shadow_proxy.serving.headers import (
    HOP_BY_HOP,
    client_response_headers,
    new_request_id,
    upstream_request_headers,
)


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def upstream(*pairs: tuple[str, str], peer: str | None = "10.0.0.9") -> CIMultiDict[str]:
    return upstream_request_headers(
        headers(*pairs),
        request_id_header="x-request-id",
        request_id="rid-1",
        peer=peer,
        scheme="http",
    )


class TestUpstreamRequest:
    """What the frontend gets: end-to-end fields only, the id set, forwarding added."""

    def test_hop_by_hop_and_connection_tokens_go(self) -> None:
        out = upstream(
            ("Connection", "keep-alive, X-Private"),
            ("Connection", "Upgrade"),
            ("X-Private", "1"),
            ("Upgrade", "h2c"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"),
            ("Proxy-Authorization", "Basic x"),
            ("Authorization", "Bearer sk"),
            ("X-Kept", "yes"),
        )
        assert "X-Private" not in out and "Upgrade" not in out
        assert not {k.lower() for k in out} & HOP_BY_HOP
        assert out["Authorization"] == "Bearer sk"  # end to end: the frontend's business
        assert out["X-Kept"] == "yes"

    def test_host_and_length_are_set_for_the_upstream_connection(self) -> None:
        out = upstream(("Host", "proxy:8080"), ("Content-Length", "12"))
        assert "Host" not in out and "Content-Length" not in out
        assert out["X-Forwarded-Host"] == "proxy:8080"
        assert out["X-Forwarded-Proto"] == "http"

    def test_request_id_replaces_the_clients(self) -> None:
        out = upstream(("X-Request-Id", "from-client"))
        assert out.getall("x-request-id") == ["rid-1"]

    def test_forwarded_for_appends_the_peer(self) -> None:
        assert upstream(("X-Forwarded-For", "1.2.3.4"))["X-Forwarded-For"] == "1.2.3.4, 10.0.0.9"
        assert upstream()["X-Forwarded-For"] == "10.0.0.9"
        assert "X-Forwarded-For" not in upstream(peer=None)

    def test_forwarded_proto_from_the_client_is_kept(self) -> None:
        assert upstream(("X-Forwarded-Proto", "https"))["X-Forwarded-Proto"] == "https"

    def test_repeated_fields_keep_their_order(self) -> None:
        out = upstream(("Accept", "a"), ("X-Tag", "1"), ("X-Tag", "2"))
        assert out.getall("X-Tag") == ["1", "2"]


class TestClientResponse:
    """What the client gets: end-to-end fields, and the request id unless the frontend set it."""

    def test_hop_by_hop_go_and_the_id_is_added(self) -> None:
        out = client_response_headers(
            headers(
                ("Connection", "X-Private"),
                ("X-Private", "1"),
                ("Transfer-Encoding", "x"),
                ("Content-Type", "text/event-stream"),
                ("X-Public", "2"),
            ),
            request_id_header="x-request-id",
            request_id="rid-1",
        )
        assert dict(out) == {
            "Content-Type": "text/event-stream",
            "X-Public": "2",
            "x-request-id": "rid-1",
        }

    def test_the_frontends_id_is_kept(self) -> None:
        out = client_response_headers(
            headers(("X-Request-Id", "frontend")),
            request_id_header="x-request-id",
            request_id="rid-1",
        )
        assert out.getall("x-request-id") == ["frontend"]

    def test_content_encoding_passes(self) -> None:
        out = client_response_headers(
            headers(("Content-Encoding", "gzip")), request_id_header="x-trace", request_id="r"
        )
        assert out["Content-Encoding"] == "gzip"


def test_new_request_ids_are_128_random_bits_in_hex() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
