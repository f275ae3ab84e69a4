"""The serving side of the taps, without a worker process: what the control
messages change, the listing before the worker is ready, the worker's main named
by its import path, and a clean stop. (Starting, restarting and stopping a real
worker: tests/integration/test_taps.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import control
from shadow_proxy.config import Config
from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.serving import supervisor
from shadow_proxy.serving.metrics import ProxyMetrics, WorkerMetricsRelay
from tests.support.servers import proxy_config


@pytest.fixture
def config() -> Config:
    taps = [
        {"name": "kv", "capture": "request", "endpoint": reserve_endpoint()},
        {"name": "replay", "capture": "request_response", "endpoint": reserve_endpoint()},
    ]
    return proxy_config("http://127.0.0.1:9", models={"m": "/nowhere"}, taps=taps)


@pytest.fixture
async def taps(config: Config) -> AsyncIterator[tuple[supervisor.Taps, CollectorRegistry]]:
    registry = CollectorRegistry()
    relay = WorkerMetricsRelay()
    registry.register(relay)
    taps = supervisor.Taps(config, ProxyMetrics.create(registry), relay)
    yield taps, registry
    if not taps.stopping:
        await taps.stop()


class TestBeforeTheWorker:
    """The sockets exist and the listing comes from the configuration."""

    async def test_listing_from_the_configuration(self, taps, config: Config) -> None:
        t, _ = taps
        assert t.listing() == [
            {"name": "kv", "topic": "shadow-requests-kv", "endpoint": config.taps[0].endpoint,
             "capture": "request", "curve": False, "filters": ["strip-worker-pins"]},
            {"name": "replay", "topic": "shadow-requests-replay",
             "endpoint": config.taps[1].endpoint, "capture": "request_response",
             "curve": False, "filters": ["strip-worker-pins"]},
        ]  # fmt: skip
        assert t.handoff.full_response is True  # a joined tap needs every chunk
        assert t.process is None

    async def test_stop_without_a_worker_removes_its_directory(self, taps) -> None:
        t, _ = taps
        directory = Path(t.dir)
        assert directory.is_dir()
        await t.stop()
        assert t.stopping and not directory.exists()


class TestControlMessages:
    """A snapshot replaces the metrics and the listing."""

    async def test_snapshot(self, taps) -> None:
        t, registry = taps
        family = ["shadow_tap_queued", "counter", "Records put on the tap's queue.",
                  [["shadow_tap_queued_total", {"tap": "kv"}, 7.0]]]  # fmt: skip
        listing = [{"name": "kv", "next_seq": 7}]
        t._apply(control.Snapshot(families=[family], taps=listing))
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) == 7
        assert t.listing() == listing
        t._apply(control.Snapshot(families=[], taps=listing))
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) is None

    async def test_ready_and_failed_change_nothing_while_serving(self, taps) -> None:
        t, _ = taps
        before = t.listing()
        t._apply(control.Ready(taps=[]))
        t._apply(control.Failed("x"))
        assert t.listing() == before


class TestWorkerMain:
    """The worker's main is named by its import path (the child imports it:
    ``lifeline.py``), so the serving side never imports the worker."""

    def test_the_worker_main_exists_under_its_name(self) -> None:
        import importlib

        module, function = supervisor.WORKER_MAIN
        assert callable(getattr(importlib.import_module(module), function))

    def test_the_stop_budget_covers_the_drain(self) -> None:
        assert supervisor.STOP_TIMEOUT_S > control.DRAIN_S
