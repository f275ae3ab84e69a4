"""Finding a tap in the proxy's /shadow/taps listing."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from shadow_proxy.records.discovery import discover

TOPIC = "shadow-requests-a"


class TestDiscovery:
    """--discover reads the proxy's tap list; a wildcard bind is reached at the proxy host."""

    def test_discover(self):
        listing = [
            {"name": "other", "topic": "t-other", "endpoint": "tcp://0.0.0.0:5558"},
            {"name": "a", "topic": TOPIC, "endpoint": "tcp://0.0.0.0:5557"},
        ]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(listing).encode()
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
            url = f"http://127.0.0.1:{server.server_port}/shadow/taps"
            assert discover(url, "a") == (TOPIC, "tcp://127.0.0.1:5557")
            with pytest.raises(LookupError, match="'missing' not found"):
                discover(url, "missing")
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


def serve_listing(listing: object) -> tuple[http.server.HTTPServer, threading.Thread, str]:
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
    return server, thread, f"http://127.0.0.1:{server.server_port}/shadow/taps"


class TestListingForms:
    """The proxy's own form ``{"taps": [...]}``; explicit hosts kept; bad entries refused."""

    def test_the_proxy_form_and_an_explicit_host(self):
        listing = {"taps": [{"name": "a", "topic": TOPIC, "endpoint": "tcp://10.1.2.3:5557"}]}
        server, thread, url = serve_listing(listing)
        try:
            assert discover(url, "a") == (TOPIC, "tcp://10.1.2.3:5557")
        finally:
            server.shutdown()
            server.server_close()
            thread.join()

    def test_an_entry_without_an_endpoint_is_not_found(self):
        server, thread, url = serve_listing([{"name": "a", "topic": TOPIC}])
        try:
            with pytest.raises(LookupError, match=r"tap 'a' not found .* \(taps: \['a'\]\)"):
                discover(url, "a")
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
