"""The image's HEALTHCHECK (deploy/healthcheck.py) fits the process it runs (issue 29).

Against a real ``shadow-proxy serve`` on a port that is not 8080: the check
finds where the proxy listens from its own configuration (``--config`` or
``$SHADOW_PROXY_CONFIG``), answers healthy while /healthz does and unhealthy
when the proxy stops answering; a container that runs something else (the
consumer) is healthy. The image lane (tests/image) runs it in containers.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shadow_proxy.devtools.processes import Child, reserve_port, wait_http_ok
from tests.support import ROOT
from tests.support.servers import serve

pytestmark = pytest.mark.timeout(90)

SCRIPT = ROOT / "deploy" / "healthcheck.py"


def load():
    spec = importlib.util.spec_from_file_location("healthcheck", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(pid: int) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command, as the image runs it (the venv's Python)."""
    env = {k: v for k, v in os.environ.items() if k != "SHADOW_PROXY_HEALTH_URL"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(pid)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )


@pytest.fixture
async def frontend():
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with serve(app) as url:
        yield url


def write_config(path: Path, port: int, upstream: str) -> Path:
    path.write_text(
        f"schema_version: 1\nlisten: {{host: 0.0.0.0, port: {port}}}\n"
        f"upstream: {{url: '{upstream}'}}\n"
    )
    return path


class TestTheProxy:
    """``shadow-proxy serve``: /healthz on the port of its own configuration."""

    @pytest.mark.parametrize("how", ["--config", "SHADOW_PROXY_CONFIG"])
    async def test_healthy_where_it_listens_unhealthy_once_it_stops_answering(
        self, frontend, tmp_path, how
    ):
        port = reserve_port()
        config = write_config(tmp_path / "config.yaml", port, frontend)
        shadow_proxy = str(Path(sys.executable).parent / "shadow-proxy")
        env = dict(os.environ)
        if how == "--config":
            argv = [shadow_proxy, "serve", "--config", config.name]
        else:
            argv = [shadow_proxy, "serve"]
            env["SHADOW_PROXY_CONFIG"] = config.name
        # A relative path: the check resolves it against the proxy's directory.
        with Child("proxy", argv, tmp_path, env=env, cwd=tmp_path) as proxy:
            await wait_http_ok(f"http://127.0.0.1:{port}/healthz", 60, children=[proxy])
            done = run_script(proxy.pid)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"http://127.0.0.1:{port}/healthz: 200" in done.stdout
            proxy.signal(signal.SIGSTOP)  # alive, not answering
            try:
                done = run_script(proxy.pid)
            finally:
                proxy.signal(signal.SIGCONT)
            assert done.returncode == 1, done.stdout + done.stderr
            assert f":{port}/healthz" in done.stdout

    async def test_the_health_url_variable_overrides(self, frontend, tmp_path, monkeypatch):
        port = reserve_port()
        config = write_config(tmp_path / "config.yaml", port, frontend)
        argv = [str(Path(sys.executable).parent / "shadow-proxy"), "serve", "--config", str(config)]
        with Child("proxy", argv, tmp_path) as proxy:
            await wait_http_ok(f"http://127.0.0.1:{port}/healthz", 60, children=[proxy])
            healthcheck = load()
            monkeypatch.setenv("SHADOW_PROXY_HEALTH_URL", f"http://127.0.0.1:{port}/readyz")
            # In a thread: /readyz asks the frontend, served by this test's loop.
            got = await asyncio.to_thread(healthcheck.check, None)
            assert got == (True, f"http://127.0.0.1:{port}/readyz: 200")
            monkeypatch.setenv("SHADOW_PROXY_HEALTH_URL", f"http://127.0.0.1:{reserve_port()}/")
            assert (await asyncio.to_thread(healthcheck.check, None))[0] is False


def fake_proc(root: Path, processes: dict[int, list[str]]) -> Path:
    for pid, argv in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "self").mkdir()
    return root


class TestWhatRuns:
    """Which process of the container is the proxy (the first ``shadow-proxy serve``)."""

    def test_the_consumer_and_its_launcher_are_not_the_proxy(self, tmp_path):
        healthcheck = load()
        proc = fake_proc(
            tmp_path,
            {
                1: ["/opt/venv/bin/python", "/opt/shadow-consumer/consumer-launcher.py"],
                7: ["/opt/venv/bin/python3", "/opt/venv/bin/shadow-consumer", "--endpoint", "x"],
            },
        )
        assert healthcheck.find_proxy(proc) is None

    def test_the_proxy_under_an_init_with_global_options(self, tmp_path):
        healthcheck = load()
        proc = fake_proc(
            tmp_path,
            {
                1: ["/run/podman-init", "--", "shadow-proxy", "serve", "--config", "/c.yaml"],
                2: [
                    *["/opt/venv/bin/python3", "/opt/venv/bin/shadow-proxy", "--log-level"],
                    *["info", "serve", "--config", "/etc/shadow-proxy/config.yaml"],
                ],
                3: ["/opt/venv/bin/python3", "-c", "from multiprocessing.spawn import spawn_main"],
            },
        )
        assert healthcheck.find_proxy(proc) == 1  # the init's arguments are the proxy's
        assert healthcheck.proxy_argv(healthcheck.read_argv(2, proc)) == [
            "--config",
            "/etc/shadow-proxy/config.yaml",
        ]

    def test_a_container_without_the_proxy_is_healthy(self, monkeypatch, tmp_path):
        healthcheck = load()
        monkeypatch.delenv("SHADOW_PROXY_HEALTH_URL", raising=False)
        healthy, why = healthcheck.check(None, fake_proc(tmp_path, {1: ["shadow-consumer"]}))
        assert healthy, why
