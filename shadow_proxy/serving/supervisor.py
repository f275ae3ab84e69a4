"""The serving process's side of the taps: the hand-off socket, the tap worker
process and the relay of its metrics.

``taps_ctx`` is an aiohttp cleanup context. At start-up it listens on the
hand-off, spawns the worker (``lifeline.spawn``: it dies with this process)
and waits until the worker has started its shards (which load the
tokenizers), bound its tap sockets and connected (or says why it cannot:
start-up then fails with that message). While serving, it reads the worker's
control messages (``channel/control.py``: ``Ready`` once, then a ``Snapshot``
each second) and restarts the worker if it dies: the
dead worker's checkpoint and the hand-off's counts make every request it held
a counted loss on each tap (``channel/checkpoint.py``), announced by the next
worker on the dead publisher ids, and ``/metrics`` counters continue from
there. At shutdown, after the last in-flight request has ended, it stops the
worker, which drains its queues for up to 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile

import zmq
import zmq.asyncio
from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_proxy import allocator, lifeline
from shadow_proxy.channel import control
from shadow_proxy.channel.checkpoint import read_checkpoint
from shadow_proxy.config import Config
from shadow_proxy.serving.handoff import Handoff
from shadow_proxy.serving.logs import RateLimited
from shadow_proxy.serving.metrics import ProxyMetrics, WorkerMetricsRelay

log = logging.getLogger(__name__)

#: Start-up budget of the worker: importing transformers and loading tokenizers.
READY_TIMEOUT_S = 120.0
#: How long the worker may take to drain and exit before it is killed.
STOP_TIMEOUT_S = control.DRAIN_S + 5.0
LIVENESS_S = 0.5
#: Tap drops are logged at most this often per tap, with the count since the
#: last line (the per-second counters are on /metrics).
DROP_LOG_INTERVAL_S = 60.0
#: The worker process's main, named by its import path: the serving process
#: never imports the worker side (tokenizers, templates); the spawned child does.
WORKER_MAIN = ("shadow_proxy.worker.main.loop", "run")
#: After this process died: the worker's own shutdown (its last messages and
#: the drain), then a margin; past this it exits without more ado.
WORKER_EXIT_AFTER_S = control.DRAIN_S + 3.0


class StartupError(RuntimeError):
    """The proxy cannot start (the listening socket, a tokenizer, a tap socket);
    the message starts with the file (and line and key where known) and says why."""


class Taps:
    """What the serving process knows of the taps."""

    def __init__(self, config: Config, metrics: ProxyMetrics, relay: WorkerMetricsRelay):
        self.config = config
        self.metrics = metrics
        self.relay = relay
        self.dir = tempfile.mkdtemp(prefix="shadow-proxy-")
        self.handoff_path = f"{self.dir}/handoff"
        self.checkpoint_path = f"{self.dir}/checkpoint"
        self.control_endpoint = f"ipc://{self.dir}/control"
        self.context = zmq.asyncio.Context()
        self.handoff = Handoff(
            self.handoff_path,
            config.worker.handoff_max_bytes,
            metrics,
            full_response=config.capture_response,
            on_final_states=relay.dead_worker_finals,
        )
        self.control = self.context.socket(zmq.PULL)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(self.control_endpoint)
        self.process: subprocess.Popen | None = None
        #: The worker's allocator (``allocator.py``), chosen once: every worker
        #: started again runs on the same one.
        self._malloc = allocator.choose(config.worker.malloc)
        if self._malloc != allocator.SYSTEM:
            log.info(
                "the tap worker's processes preload %s (worker.malloc: %s)",
                self._malloc,
                config.worker.malloc,
            )
        #: What the current worker said when ready, and its latest counters.
        self._taps: tuple[control.TapInfo, ...] = ()
        self._counters: tuple[control.TapCounters, ...] = ()
        self.stopping = False
        #: Per tap and reason: dropped at the last snapshot, and since the last log line.
        self._dropped_seen: dict[str, dict[str, int]] = {}
        self._dropped_unlogged: dict[str, dict[str, int]] = {}
        self._drop_log = RateLimited(log, burst=1, interval_s=DROP_LOG_INTERVAL_S)

    def listing(self) -> list[dict]:
        """``/shadow/taps``: the current worker's taps and their latest counters."""
        return control.listing(self._taps, self._counters)

    def _alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start_worker(self) -> None:
        if self.handoff._server is None:
            await self.handoff.start()
        self.handoff.generation += 1
        generation = self.handoff.generation
        args = (
            self.config,
            self.handoff_path,
            self.control_endpoint,
            self.checkpoint_path,
            generation,
        )
        env = allocator.worker_env(self._malloc)
        process = lifeline.spawn(WORKER_MAIN, args, exit_after_s=WORKER_EXIT_AFTER_S, env=env)
        self.process = process
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while True:
                    match await self._receive():
                        case control.Ready(taps=taps):
                            self._taps, self._counters = taps, ()
                            break
                        case control.Failed(message=why):
                            raise StartupError(why)
                        case control.Snapshot() as snapshot:  # a dead predecessor's last
                            self._apply(snapshot)
        except TimeoutError as e:
            process.kill()
            lifeline.reap(process)
            msg = f"{self.config.path}: the tap worker was not ready within {READY_TIMEOUT_S:.0f}s"
            raise StartupError(msg) from e
        except BaseException:
            if process.poll() is None:
                process.kill()
            lifeline.reap(process)
            raise
        log.info("tap worker ready (pid %d), %d tap(s)", process.pid, len(self.config.taps))

    async def _receive(self) -> control.ControlMessage:
        while True:
            if await self.control.poll(100):
                return control.decode(await self.control.recv())
            if self.process is not None and not self._alive():
                code = self.process.returncode
                msg = f"{self.config.path}: the tap worker exited with status {code} while starting"
                raise StartupError(msg)

    async def watch(self) -> None:
        """Relay snapshots; restart the worker when it dies."""
        while not self.stopping:
            if await self.control.poll(LIVENESS_S * 1000):
                self._apply(control.decode(await self.control.recv()))
                continue
            process = self.process
            if process is not None and not self._alive() and not self.stopping:
                lifeline.reap(process)
                # Its checkpoint is final now: the next worker accounts for its loss.
                self.handoff.worker_died(read_checkpoint(self.checkpoint_path))
                self.relay.worker_died(self.handoff.generation)
                self.metrics.worker_restarts.inc()
                log.error("tap worker died (exit status %s); restarting", process.returncode)
                try:
                    await self.start_worker()
                except StartupError as e:
                    log.error("tap worker restart failed: %s", e)
                    await asyncio.sleep(1.0)

    def _apply(self, message: control.ControlMessage) -> None:
        """A snapshot counts for the worker that sent it, even one read after that
        worker died; only the current worker's is the listing."""
        if not isinstance(message, control.Snapshot):
            return
        self.relay.update(message.generation, message.families)
        if message.generation == self.handoff.generation:
            self._counters = message.taps
            self._log_drops()

    def _log_drops(self) -> None:
        """A line when a tap drops records: at once, then at most once per
        ``DROP_LOG_INTERVAL_S`` while the drops go on, with how many and why
        since the last line (reasons come from a fixed vocabulary)."""
        for info, counters in zip(self._taps, self._counters, strict=False):
            name, dropped = info.name, counters.dropped
            last = self._dropped_seen.get(name, {})
            self._dropped_seen[name] = dict(dropped)
            unlogged = self._dropped_unlogged.setdefault(name, {})
            for reason, n in dropped.items():
                # A restarted worker counts from zero: then all of n is new.
                new = n - last.get(reason, 0) if n >= last.get(reason, 0) else n
                if new > 0:
                    unlogged[reason] = unlogged.get(reason, 0) + new
            if not unlogged or self._drop_log.allow(name) is None:
                continue
            reasons = ", ".join(f"{r}={n}" for r, n in sorted(unlogged.items()))
            log.warning(
                "tap %s dropped %d record(s) since the last line (%s); see "
                "shadow_tap_dropped_total",
                name,
                sum(unlogged.values()),
                reasons,
            )
            unlogged.clear()

    async def stop(self) -> None:
        """Stop the worker after the serving loop has sent its last message."""
        self.stopping = True
        process = self.process
        self.handoff.close()
        if process is not None and self._alive():
            os.kill(process.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STOP_TIMEOUT_S
            while self._alive() and loop.time() < deadline:
                if await self.control.poll(50):
                    self._apply(control.decode(await self.control.recv()))
            while await self.control.poll(0):  # its last snapshot, sent as it exited
                self._apply(control.decode(await self.control.recv()))
            if self._alive():
                log.error("tap worker did not stop in %.0fs; killed", STOP_TIMEOUT_S)
                process.kill()
        if process is not None:
            lifeline.reap(process, 1)
        self.control.close(linger=0)
        self.context.term()
        shutil.rmtree(self.dir, ignore_errors=True)


#: Hosts that mean "every interface" in a tap endpoint.
ALL_INTERFACES = frozenset({"0.0.0.0", "*", "::", "[::]"})


def warn_open_taps(config: Config) -> None:
    """A warning per tap bound on every interface without CURVE: records hold
    the prompts (token ids decode back to text) and anyone who reaches the port
    reads them."""
    for tap in config.taps:
        scheme, _, rest = tap.endpoint.partition("://")
        host = rest.rpartition(":")[0]
        if scheme == "tcp" and host in ALL_INTERFACES and tap.curve is None:
            log.warning(
                "tap %s binds every interface (%s) without CURVE: anyone who can reach "
                "the port reads the prompts; set taps[].curve, or publish.host: 127.0.0.1",
                tap.name,
                tap.endpoint,
            )


#: The app's taps (set only when the configuration has taps).
TAPS = web.AppKey("taps", Taps)


def taps_context(config: Config, metrics: ProxyMetrics, registry: CollectorRegistry):
    """An aiohttp cleanup context for the taps of ``config``.

    At start-up: bind the hand-off, spawn the worker and wait until it is ready
    (or fail start-up with its reason). While serving: relay its metrics and
    restart it when it dies. At cleanup (after the last in-flight request has
    ended): stop the worker, which drains its queues for up to
    ``control.DRAIN_S``.
    """

    async def taps_ctx(app: web.Application):
        warn_open_taps(config)
        relay = WorkerMetricsRelay()
        registry.register(relay)
        taps = Taps(config, metrics, relay)
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

    return taps_ctx
