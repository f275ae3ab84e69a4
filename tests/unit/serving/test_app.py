"""The application's own endpoints and wiring (no taps: no worker process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp

from shadow_proxy.devtools.processes import (
    reserve_port,
)
from shadow_proxy.serving.app import HANDLER, TAPS
from tests.support.client import assert_sse_done, chat_body, post, sample
from tests.support.scripted import fetch
from tests.support.servers import proxy_config, run_proxy


class TestOwnEndpoints:
    """/healthz, /readyz and /metrics answer for the proxy itself."""

    async def test_healthz_and_readyz(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            assert (await fetch(s, "GET", purl + "/healthz"))[0] == 200
            assert (await fetch(s, "GET", purl + "/readyz"))[0] == 200

    async def test_readyz_503_when_frontend_down(self):
        config = proxy_config(f"http://127.0.0.1:{reserve_port()}")
        async with run_proxy(config) as (purl, _, _), aiohttp.ClientSession() as s:
            assert (await fetch(s, "GET", purl + "/healthz"))[0] == 200
            assert (await fetch(s, "GET", purl + "/readyz"))[0] == 503

    async def test_metrics_fixed_route_labels(self, frontend, proxy):
        purl, registry = proxy
        async with aiohttp.ClientSession() as s:
            await fetch(s, "GET", purl + "/v1/models")
            await fetch(s, "GET", purl + "/status?code=404")
            await fetch(s, "GET", purl + "/a/b/c/secret-path")
            body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
            await fetch(s, "POST", purl + "/v1/chat/completions", data=body)
            status, headers, text = await fetch(s, "GET", purl + "/metrics")
        assert status == 200
        text = text.decode()
        assert "secret-path" not in text
        value = registry.get_sample_value
        assert value("shadow_proxy_requests_total", {"route": "models", "status_class": "2xx"}) == 1
        assert value("shadow_proxy_requests_total", {"route": "other", "status_class": "4xx"}) == 1
        assert value("shadow_proxy_requests_total", {"route": "chat", "status_class": "2xx"}) == 1
        assert value("shadow_proxy_upstream_ttfb_seconds_count", {"route": "chat"}) == 1
        assert (
            value("shadow_proxy_request_duration_seconds_bucket", {"route": "chat", "le": "1200.0"})
            == 1
        )
        assert value("shadow_proxy_in_flight_requests") == 0


def children() -> set[str]:
    """This process's child processes (a tap worker would be one)."""
    pid = os.getpid()
    return set(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


class TestNoTaps:
    """Without taps there is no worker, no socket and no capture."""

    async def test_no_worker_no_listing_no_tap_metrics(self, frontend):
        before = children()
        async with run_proxy(proxy_config(frontend.url)) as (url, registry, app):
            assert TAPS not in app
            assert children() == before
            async with aiohttp.ClientSession() as s:
                status, headers, body = await post(s, url, json=chat_body())
                assert_sse_done(status, body)
                async with s.get(url + "/shadow/taps") as r:
                    assert await r.json() == {"taps": []}
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
            assert "shadow_tap_" not in text
            assert "shadow_not_mirrored" not in text
            assert sample(registry, "shadow_handoff_dropped_total", reason="worker_dead") == 0
            assert app[HANDLER].handoff is None
