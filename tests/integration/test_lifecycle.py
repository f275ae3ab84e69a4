"""Start-up, shutdown and crashes of the real ``shadow-proxy serve`` process
(issue 17 items 2, 3, 5 and 8; issue 18 item 6's descriptor limit).

- SIGTERM: in-flight streams get ``shutdown_grace_s`` once, then the taps drain;
- a child never outlives its parent: SIGKILL the serving process, the tap
  worker is gone within a bound and the next start succeeds;
- start-up errors (listen port, tap port, tokenizer) are one line naming the
  file, line and key, exit 2, and ``serving on`` is logged only after start-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.devtools.processes import bound_socket, reserve_port, wait_until
from shadow_proxy.lifeline import EXIT_AFTER_S
from tests.integration.harness import (
    Proxy,
    alive,
    children_of,
    config_text,
)
from tests.support.servers import serve

pytestmark = [pytest.mark.timeout(180), pytest.mark.solo]


def endless_stream() -> web.Application:
    """A chat stream of one event every 100 ms, forever."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        i = 0
        while True:
            chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.1)
            i += 1

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    return app


def taps_text(model_dir: Path, tap_port: int, capture: str = "request_response") -> str:
    return (
        f"models:\n  - {{name: deepseek, tokenizer: '{model_dir}'}}\n"
        f"taps:\n  - {{name: a, capture: {capture}, "
        f"endpoint: 'tcp://127.0.0.1:{tap_port}'}}\n"
    )


CHAT = {"model": "deepseek", "messages": [{"role": "user", "content": "hi"}], "stream": True}


class TestSigtermGrace:
    """The stream is cut at the grace, not twice the grace; then the taps drain."""

    async def test_grace_2_cuts_within_2_to_3_seconds_and_the_record_is_published(
        self, tmp_path, model_dirs, subscribe
    ):
        tap_port = reserve_port()
        async with serve(endless_stream()) as upstream:
            text = config_text(reserve_port(), upstream, grace=2)
            text += taps_text(model_dirs["deepseek"], tap_port)
            proxy = Proxy(tmp_path, text).start()
            sub = subscribe(f"tcp://127.0.0.1:{tap_port}", "shadow-requests-a")
            try:
                await proxy.wait_ready()
                await sub.wait_heartbeats()
                async with aiohttp.ClientSession() as session:
                    async with session.post(
                        proxy.url + "/v1/chat/completions", json=CHAT
                    ) as response:
                        await response.content.readline()
                        started = time.monotonic()
                        proxy.process.send_signal(signal.SIGTERM)
                        with pytest.raises(aiohttp.ClientPayloadError):
                            while await response.content.readany():
                                pass
                        cut = time.monotonic() - started
                [record] = await sub.wait_records(1, timeout=15)
                exit_code = await asyncio.to_thread(proxy.process.wait, 30)
            finally:
                proxy.stop()
        assert 2.0 <= cut < 3.0, f"cut {cut:.2f}s after SIGTERM with a 2s grace"
        assert exit_code == 0
        # The cut stream's joined record left the worker before it exited.
        assert record["response"]["outcome"] == "error"
        assert record["response"]["error"] == "proxy shut down"
        assert record["response"]["output_tokens"] > 0


class TestChildNeverOutlivesParent:
    """SIGKILL of the serving process: its children end within a bound; the next
    start (same ports) succeeds."""

    async def test_sigkill_serving_process(self, tmp_path, model_dirs):
        tap_port = reserve_port()
        text = config_text(reserve_port(), "http://127.0.0.1:9")
        text += taps_text(model_dirs["deepseek"], tap_port, capture="request")
        proxy = Proxy(tmp_path, text).start()
        try:
            await proxy.wait_ready()
            children = children_of(proxy.pid)
            assert children, "no tap worker process"
            proxy.process.send_signal(signal.SIGKILL)
            proxy.process.wait(10)
            await wait_until(
                lambda: not any(alive(pid) for pid in children),
                EXIT_AFTER_S + 3.0,
                0.1,
                what=f"children {children} gone after their parent was killed",
            )
            again = Proxy(tmp_path, text, name="again").start()
            try:
                await again.wait_ready()
            finally:
                assert again.stop() == 0
        finally:
            proxy.stop()


def run_serve(config: Path, *, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shadow_proxy.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class TestStartupErrors:
    """One line naming file, line and key; exit 2; nothing served, nothing logged as serving."""

    def test_listen_port_in_use_fails_before_the_worker(self, tmp_path, model_dirs):
        with bound_socket() as taken:  # a listener holds the port
            port = taken.getsockname()[1]
            config = tmp_path / "proxy.yaml"
            config.write_text(
                config_text(port, "http://127.0.0.1:9")
                + taps_text(model_dirs["deepseek"], reserve_port(), capture="request")
            )
            started = time.monotonic()
            result = run_serve(config)
            elapsed = time.monotonic() - started
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert lines == [
            f"shadow-proxy: {config}:2: 'listen.port': cannot listen on 127.0.0.1:{port} "
            "(address already in use)"
        ], result.stderr
        # No worker was spawned: loading the tokenizer alone takes longer.
        assert elapsed < 10

    def test_tap_port_in_use_names_the_tap_and_line(self, tmp_path, model_dirs):
        with bound_socket() as taken:  # a listener holds the port
            tap_port = taken.getsockname()[1]
            config = tmp_path / "proxy.yaml"
            config.write_text(
                config_text(reserve_port(), "http://127.0.0.1:9")
                + taps_text(model_dirs["deepseek"], tap_port, capture="request")
            )
            result = run_serve(config)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1] == (
            f"shadow-proxy: {config}:8: 'taps[a].endpoint': tap 'a' cannot bind "
            f"tcp://127.0.0.1:{tap_port} (Address already in use)"
        ), result.stderr
        assert "serving on" not in result.stderr
        assert "Traceback" not in result.stderr

    def test_missing_tokenizer_directory_relative_to_the_file(self, tmp_path):
        (tmp_path / "conf").mkdir()
        config = tmp_path / "conf" / "proxy.yaml"
        config.write_text(
            config_text(reserve_port(), "http://127.0.0.1:9")
            + "models:\n  - {name: m, tokenizer: ./models/m}\n"
            + f"taps:\n  - {{name: a, capture: request, endpoint: 'tcp://127.0.0.1:{reserve_port()}'}}\n"
        )
        result = run_serve(config)
        assert result.returncode == 2, result.stderr
        missing = tmp_path / "conf" / "models" / "m"
        assert result.stderr.splitlines()[-1] == (
            f"shadow-proxy: {config}:6: 'models[0].tokenizer': tokenizer directory "
            f"{missing} for model 'm' does not exist"
        ), result.stderr
        assert "hub" not in result.stderr
        assert "serving on" not in result.stderr


class TestFileDescriptorLimit:
    """The soft limit on open files is raised to the hard limit, and said so."""

    async def test_soft_limit_raised(self, tmp_path):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard <= 256:
            pytest.skip(f"hard limit {hard}: nothing to raise")

        proxy = Proxy(
            tmp_path,
            config_text(reserve_port(), "http://127.0.0.1:9"),
            wrapper=["prlimit", f"--nofile=256:{hard}"],  # execs the proxy: same pid
        ).start()
        try:
            await proxy.wait_ready()
            limits = Path(f"/proc/{proxy.pid}/limits").read_text()
            line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
            assert line.split()[3:5] == [str(hard), str(hard)], line
            assert f"soft limit raised from 256 to the hard limit {hard}" in proxy.log().decode()
            assert os.getpid()  # the test process itself is untouched
        finally:
            assert proxy.stop() == 0
