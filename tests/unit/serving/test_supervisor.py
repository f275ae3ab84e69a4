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


def info(name: str, endpoint: str) -> control.TapInfo:
    return control.TapInfo(
        name=name,
        topic=f"shadow-requests-{name}",
        endpoint=endpoint,
        capture="request",
        curve=False,
        filters=("strip-worker-pins",),
        models=(),
        sample=1.0,
        capacity=1024,
        transport="zmq",
        publisher_id=1,
    )


class TestBeforeTheWorker:
    """The sockets exist; the listing is the worker's, so there is none yet."""

    async def test_no_listing_before_ready(self, taps) -> None:
        t, _ = taps
        assert t.listing() == []
        assert t.handoff.full_response is True  # a joined tap needs every chunk
        assert t.process is None

    async def test_stop_without_a_worker_removes_its_directory(self, taps) -> None:
        t, _ = taps
        directory = Path(t.dir)
        assert directory.is_dir()
        await t.stop()
        assert t.stopping and not directory.exists()


def queued(value: float) -> list:
    return [
        "shadow_tap_queued",
        "counter",
        "Records put on the tap's queue.",
        [["shadow_tap_queued_total", {"tap": "kv"}, value]],
    ]


class TestControlMessages:
    """A snapshot updates the metrics of the worker that sent it, and the listing
    when that worker is the current one."""

    async def test_snapshot(self, taps, config: Config) -> None:
        t, registry = taps
        t.handoff.generation = 2
        t._taps = (info("kv", config.taps[0].endpoint),)
        t._apply(control.Snapshot(2, [queued(7.0)], (control.TapCounters(next_seq=7),)))
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) == 7
        [kv] = t.listing()
        assert (kv["name"], kv["next_seq"]) == ("kv", 7)
        # The dead predecessor's last snapshot, read late: counted, not listed.
        t._apply(control.Snapshot(1, [queued(3.0)], (control.TapCounters(next_seq=3),)))
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) == 10
        assert t.listing()[0]["next_seq"] == 7

    async def test_ready_and_failed_change_nothing_while_serving(self, taps) -> None:
        t, _ = taps
        before = t.listing()
        t._apply(control.Ready(taps=()))
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
