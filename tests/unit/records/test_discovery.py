"""Finding a tap in the proxy's /shadow/taps listing."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from shadow_proxy.records.discovery import discover

TOPIC = "shadow-requests-a"


@contextlib.contextmanager
def serve_listing(listing: object) -> Iterator[str]:
    """An HTTP server on loopback answering ``listing`` as JSON; yields its URL."""
    body = json.dumps(listing).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/shadow/taps"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class TestDiscovery:
    """--discover reads the proxy's tap list; a wildcard bind is reached at the proxy host."""

    def test_discover(self):
        listing = [
            {"name": "other", "topic": "t-other", "endpoint": "tcp://0.0.0.0:5558"},
            {"name": "a", "topic": TOPIC, "endpoint": "tcp://0.0.0.0:5557"},
        ]

        with serve_listing(listing) as url:
            assert discover(url, "a") == (TOPIC, "tcp://127.0.0.1:5557")
            with pytest.raises(LookupError, match="'missing' not found"):
                discover(url, "missing")


class TestListingForms:
    """The proxy's own form ``{"taps": [...]}``; explicit hosts kept; bad entries refused."""

    def test_the_proxy_form_and_an_explicit_host(self):
        listing = {"taps": [{"name": "a", "topic": TOPIC, "endpoint": "tcp://10.1.2.3:5557"}]}
        with serve_listing(listing) as url:
            assert discover(url, "a") == (TOPIC, "tcp://10.1.2.3:5557")

    def test_an_entry_without_an_endpoint_is_not_found(self):
        with serve_listing([{"name": "a", "topic": TOPIC}]) as url:
            with pytest.raises(LookupError, match=r"tap 'a' not found .* \(taps: \['a'\]\)"):
                discover(url, "a")
