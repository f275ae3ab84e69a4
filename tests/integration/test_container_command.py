"""The image's exact command line works from a fresh virtual environment.

Without a container engine (the image lane, tests/image, has one), this does
what the Dockerfile's stages do: a new venv, the lean image's lock file
installed into it, the project as a wheel would be (not editable, no
dependencies of its own), then the runtime stage's ENTRYPOINT + CMD with the
config path pointed at a temporary file. The proxy must answer /healthz,
/readyz and /metrics: the lean set is enough to serve.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.devtools.processes import Child, reserve_port, wait_http_ok
from tests.support import ROOT
from tests.support.servers import serve

pytestmark = pytest.mark.slow


def runtime_command() -> list[str]:
    """ENTRYPOINT + CMD of the Dockerfile's default (last) stage, as exec-form lists."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    entrypoint = cmd = None
    for line in text.splitlines():
        if m := re.match(r"\s*ENTRYPOINT\s+(\[.*\])\s*$", line):
            entrypoint = json.loads(m[1])
        if m := re.match(r"\s*CMD\s+(\[.*\])\s*$", line):
            cmd = json.loads(m[1])
    assert entrypoint and cmd, "the Dockerfile needs exec-form ENTRYPOINT and CMD"
    return entrypoint + cmd


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # As the image's stages: the lean lock (hashes checked), then the project, not
    # editable, without dependencies. uv (make installs the dev venv with it)
    # where pip takes a minute.
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        install = [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
    else:
        install = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    lock = ROOT / "requirements" / "image-lean.txt"
    subprocess.run([*install, "--require-hashes", "-r", str(lock)], check=True, timeout=900)
    subprocess.run([*install, "--no-deps", str(ROOT)], check=True, timeout=900)
    return venv


async def test_image_command_answers_health_ready_metrics(fresh_venv, tmp_path):
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    frontend = web.Application()
    frontend.router.add_get("/v1/models", models)
    async with serve(frontend) as upstream:
        port = reserve_port()
        config = tmp_path / "config.yaml"
        config.write_text(
            f"schema_version: 1\nlisten: {{host: 127.0.0.1, port: {port}}}\n"
            f"upstream: {{url: '{upstream}'}}\n"
        )
        command = runtime_command()
        assert command[:2] == ["shadow-proxy", "serve"]
        command[0] = str(fresh_venv / "bin" / command[0])
        command[command.index("--config") + 1] = str(config)
        with Child("proxy", command, tmp_path) as proxy:
            url = f"http://127.0.0.1:{port}"
            await wait_http_ok(url + "/healthz", 60, children=[proxy])
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/readyz") as r:
                    assert r.status == 200
                async with s.get(url + "/metrics") as r:
                    assert r.status == 200
                    assert "shadow_proxy_requests_total" in await r.text()
            assert await proxy.stop(30) == 0
