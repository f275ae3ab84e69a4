"""Finding a tap from the proxy's ``/shadow/taps`` listing (SPEC section 8).

One HTTP GET with the standard library; used by every record source that
reads a live tap by name.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

_ANY_HOSTS = {"0.0.0.0", "*", "[::]", "::"}


def discover(url: str, tap: str, timeout: float = 5.0) -> tuple[str, str]:
    """(topic, endpoint) of the tap named ``tap`` from the proxy's tap list.

    The list is JSON: a list of ``{name, topic, endpoint}`` (or ``{"taps": [...]}``).
    An endpoint bound on every interface is reached at the proxy's own host.
    """
    with urllib.request.urlopen(url, timeout=timeout) as response:
        listing = json.loads(response.read())
    if isinstance(listing, dict):
        listing = listing.get("taps", [])
    for entry in listing if isinstance(listing, list) else []:
        if isinstance(entry, dict) and entry.get("name") == tap:
            topic, endpoint = entry.get("topic"), entry.get("endpoint")
            if not isinstance(topic, str) or not isinstance(endpoint, str):
                break
            scheme, _, rest = endpoint.partition("://")
            host, _, port = rest.rpartition(":")
            if scheme == "tcp" and host in _ANY_HOSTS:
                proxy_host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
                if ":" in proxy_host:
                    proxy_host = f"[{proxy_host}]"
                endpoint = f"tcp://{proxy_host}:{port}"
            return topic, endpoint
    names = [e.get("name") for e in listing if isinstance(e, dict)] if listing else []
    msg = f"tap {tap!r} not found at {url} (taps: {names})"
    raise LookupError(msg)
