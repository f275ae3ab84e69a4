"""One real nats-server started, paused, killed and restarted on its ports (the
binary and the configuration: tests/unit/devtools/test_nats_server.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shadow_proxy.devtools import nats_server
from shadow_proxy.devtools.nats_server import NatsCluster, NatsServer
from shadow_proxy.devtools.processes import ChildExited, bound_socket


@pytest.mark.timeout(60)
class TestLifecycle:
    """Healthy when started; a kill keeps the store and the ports for a restart."""

    def test_start_kill_restart_stop(self, tmp_path: Path) -> None:
        with nats_server.running_cluster(tmp_path / "nats") as cluster:
            [server] = cluster.servers
            assert server.running and server.healthy()
            server.pause()
            assert not server.healthy()
            server.resume()
            assert server.healthy()
            server.kill()
            assert not server.running and not server.healthy()
            server.start()
            server.wait_healthy()
            assert server.store_dir.is_dir()
        assert not server.running

    async def test_waits_from_a_running_event_loop(self, tmp_path: Path) -> None:
        cluster = NatsCluster.create(tmp_path / "nats")
        try:
            cluster.start()  # blocks this loop's thread, as the tests and the demo use it
            [server] = cluster.servers
            assert server.healthy()
            await server.wait_ready(5)
        finally:
            cluster.stop()
        assert not server.running and server.process is not None

    def test_a_server_that_exits_fails_the_wait_at_once(self, tmp_path: Path) -> None:
        with bound_socket() as taken:  # a listener holds the port
            server = NatsServer("a", tmp_path / "a", port=taken.getsockname()[1])
            server.start()
            started = time.monotonic()
            with pytest.raises(ChildExited, match="address already in use"):
                server.wait_healthy(timeout=30)
        assert time.monotonic() - started < 10
        assert "address already in use" in server.log_tail()

    def test_starting_twice_is_refused(self, tmp_path: Path) -> None:
        with nats_server.running_cluster(tmp_path / "nats") as cluster:
            with pytest.raises(RuntimeError, match="already running"):
                cluster.servers[0].start()
