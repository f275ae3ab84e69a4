"""The serving process's side of the taps: the hand-off socket, the tap worker
process and the relay of its metrics.

``taps_ctx`` is an aiohttp cleanup context. At start-up it binds the hand-off,
spawns the worker and waits until the worker has loaded its tokenizers and
bound its tap sockets (or says why it cannot: start-up then fails with that
message). While serving, it reads the worker's snapshots each second and
restarts the worker if it dies (requests meanwhile are counted as
``worker_dead`` drops). At shutdown, after the last in-flight request has
ended, it stops the worker, which drains its queues for up to 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile

import msgpack
import zmq
import zmq.asyncio
from aiohttp import web
from prometheus_client.core import Metric

from shadow_proxy import worker as worker_module
from shadow_proxy.config import Config
from shadow_proxy.handoff import Handoff
from shadow_proxy.metrics import ProxyMetrics, WorkerMetricsRelay

log = logging.getLogger(__name__)

#: Start-up budget of the worker: importing transformers and loading tokenizers.
READY_TIMEOUT_S = 120.0
#: How long the worker may take to drain and exit before it is killed.
STOP_TIMEOUT_S = worker_module.DRAIN_S + 5.0
LIVENESS_S = 0.5


class StartupError(RuntimeError):
    """The taps cannot start (a tokenizer, a socket); the message says why."""


class Taps:
    """What the serving process knows of the taps."""

    def __init__(self, config: Config, metrics: ProxyMetrics, relay: WorkerMetricsRelay):
        self.config = config
        self.metrics = metrics
        self.relay = relay
        self.dir = tempfile.mkdtemp(prefix="shadow-proxy-")
        self.handoff_endpoint = f"ipc://{self.dir}/handoff"
        self.control_endpoint = f"ipc://{self.dir}/control"
        self.context = zmq.asyncio.Context()
        self.sync_context = zmq.Context.shadow(self.context.underlying)
        self.handoff = Handoff(
            self.sync_context,
            self.handoff_endpoint,
            config.worker.handoff_capacity,
            config.worker.handoff_max_bytes,
            metrics,
        )
        self.handoff.full_response = config.capture_response
        self.control = self.context.socket(zmq.PULL)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(self.control_endpoint)
        self.process: multiprocessing.process.BaseProcess | None = None
        self._listing: list[dict] = [
            {
                "name": t.name,
                "topic": t.topic,
                "endpoint": t.endpoint,
                "capture": t.capture,
                "filters": list(t.filters.names),
            }
            for t in config.taps
        ]
        self.stopping = False

    def listing(self) -> list[dict]:
        return self._listing

    async def start_worker(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        process = spawn.Process(
            target=_worker_entry,
            args=(self.config, self.handoff_endpoint, self.control_endpoint),
            name="shadow-proxy-tap-worker",
            daemon=True,
        )
        process.start()
        self.process = process
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while True:
                    message = await self._receive()
                    if message.get("kind") == "ready":
                        self._listing = message.get("taps", self._listing)
                        break
                    if message.get("kind") == "error":
                        raise StartupError(message.get("message", "the tap worker failed"))
        except TimeoutError as e:
            process.kill()
            msg = f"the tap worker was not ready within {READY_TIMEOUT_S:.0f}s"
            raise StartupError(msg) from e
        except BaseException:
            if process.is_alive():
                process.kill()
            raise
        self.handoff.restarted()
        log.info("tap worker ready (pid %d), %d tap(s)", process.pid, len(self.config.taps))

    async def _receive(self) -> dict:
        while True:
            if await self.control.poll(100):
                data = await self.control.recv()
                return msgpack.unpackb(data)
            if self.process is not None and not self.process.is_alive():
                msg = f"the tap worker exited with status {self.process.exitcode} while starting"
                raise StartupError(msg)

    async def watch(self) -> None:
        """Relay snapshots; restart the worker when it dies."""
        while not self.stopping:
            if await self.control.poll(LIVENESS_S * 1000):
                self._apply(msgpack.unpackb(await self.control.recv()))
                continue
            process = self.process
            if process is not None and not process.is_alive() and not self.stopping:
                self.handoff.worker_alive = False
                self.metrics.worker_restarts.inc()
                log.error("tap worker died (exit status %s); restarting", process.exitcode)
                try:
                    await self.start_worker()
                except StartupError as e:
                    log.error("tap worker restart failed: %s", e)
                    await asyncio.sleep(1.0)

    def _apply(self, message: dict) -> None:
        kind = message.get("kind")
        if kind == "progress":
            self.handoff.acked_bytes = message["bytes"]
            return
        if kind != "metrics":
            return
        self.handoff.acked_bytes = message.get("bytes", self.handoff.acked_bytes)
        families = []
        for name, kind, doc, samples in message.get("families", []):
            family = Metric(name, doc, kind)
            for sample_name, labels, value in samples:
                family.add_sample(sample_name, labels, value)
            families.append(family)
        self.relay.update(families)
        self._listing = message.get("taps", self._listing)

    async def stop(self) -> None:
        """Stop the worker after the serving loop has sent its last message."""
        self.stopping = True
        process = self.process
        self.handoff.close()
        if process is not None and process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STOP_TIMEOUT_S
            while process.is_alive() and loop.time() < deadline:
                if await self.control.poll(50):
                    self._apply(msgpack.unpackb(await self.control.recv()))
            if process.is_alive():
                log.error("tap worker did not stop in %.0fs; killed", STOP_TIMEOUT_S)
                process.kill()
            process.join(1)
        self.control.close(linger=0)
        self.context.term()
        shutil.rmtree(self.dir, ignore_errors=True)


def _worker_entry(config: Config, handoff_endpoint: str, control_endpoint: str) -> None:
    raise SystemExit(worker_module.run(config, handoff_endpoint, control_endpoint))


async def taps_ctx(app: web.Application):
    from shadow_proxy.app import CONFIG, METRICS, REGISTRY, TAPS

    relay = WorkerMetricsRelay()
    app[REGISTRY].register(relay)
    taps = Taps(app[CONFIG], app[METRICS], relay)
    try:
        await taps.start_worker()
    except BaseException:
        await taps.stop()
        raise
    app[TAPS] = taps
    watcher = asyncio.create_task(taps.watch())
    yield
    taps.stopping = True
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await taps.stop()
