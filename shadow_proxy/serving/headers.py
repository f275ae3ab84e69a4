"""The request head as a reverse proxy forwards it: the target, hop-by-hop
filtering and request ids.

The target is forwarded as the client wrote it (``upstream_target``); an
absolute-form target by its path and query.

RFC 9110 section 7.6.1: a proxy removes the connection-specific fields
(``Connection`` and every field it names, ``Proxy-Connection``, ``Keep-Alive``,
``TE``, ``Transfer-Encoding``, ``Upgrade``) before forwarding a message in
either direction. Everything else passes unchanged.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)

#: Request fields the proxy handles itself: ``Host`` and ``Content-Length`` are
#: set for the upstream connection; ``Expect: 100-continue`` is answered by the
#: proxy (it reads the whole body before forwarding), so forwarding it would
#: make a frontend that sends its own 100 wait for nothing.
_REQUEST_OWN = frozenset({"host", "content-length", "expect"})


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", ()):
        tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def _end_to_end(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], also_drop: Iterable[str] = ()
) -> CIMultiDict[str]:
    drop = HOP_BY_HOP | _connection_tokens(headers) | set(also_drop)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def upstream_request_headers(
    headers: CIMultiDictProxy[str],
    *,
    request_id_header: str,
    request_id: str,
    peer: str | None,
    scheme: str,
) -> CIMultiDict[str]:
    """The client's headers as the frontend should get them.

    Hop-by-hop fields, ``Host``/``Content-Length`` (set for the upstream
    connection) and ``Expect`` (answered by the proxy) go; the request id is
    set; ``X-Forwarded-For`` gains the peer.
    """
    out = _end_to_end(headers, _REQUEST_OWN)
    out[request_id_header] = request_id
    if peer:
        prior = out.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    out.setdefault("X-Forwarded-Proto", scheme)
    if "Host" in headers:
        out.setdefault("X-Forwarded-Host", headers["Host"])
    return out


def client_response_headers(
    headers: CIMultiDictProxy[str], *, request_id_header: str, request_id: str
) -> CIMultiDict[str]:
    """The frontend's response headers as the client should get them."""
    out = _end_to_end(headers)
    out.setdefault(request_id_header, request_id)
    return out


def new_request_id() -> str:
    """128 random bits as 32 hex digits (uuid4's hex without building a UUID)."""
    return secrets.token_hex(16)


def upstream_target(raw_target: str) -> str | None:
    """The request target to send upstream, as the client wrote it.

    Origin-form (``/path?query``) as it is; absolute-form
    (``http://host/path?query``, RFC 9112 section 3.2.2) by its path and query,
    as the frontends' servers read it; anything else (authority-form) None.
    """
    if raw_target.startswith("/"):
        return raw_target
    scheme, sep, rest = raw_target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return None
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    target = rest[cut:]
    return target if target.startswith("/") else "/" + target
