"""The processes a benchmark case starts: the frontend under test (built-in,
Dynamo or vLLM), nginx (the C reference) and shadow-proxy with the reference taps."""

from __future__ import annotations

import os
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from bench.procfs import children, pin
from shadow_proxy.devtools.dynamo import Dynamo, start_dynamo
from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
    reserve_endpoint,
    reserve_port,
    wait_http_ok,
)
from shadow_proxy.devtools.reference_taps import (
    TAP_NAMES,
    proxy_config,
    reference_taps,
    write_config,
)
from shadow_proxy.devtools.vllm import Vllm, start_vllm

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
MODEL_NAME = "deepseek"
MODEL_DIR = REPO / ".models" / "deepseek"
#: vLLM's model: a tiny random-weight Llama with DeepSeek's tokenizer (``make vllm``).
VLLM_MODEL_DIR = REPO / ".models" / "llama"
#: How long a frontend or the proxy (loading its tokenizers) may take to answer.
START_TIMEOUT_S = 120.0
#: Isolation: the proxy and its worker on this core, everything else on the other.
PROXY_CPU, OTHER_CPU = "1", "0"


def service(
    name: str,
    argv: list[str],
    log_dir: Path,
    *,
    cpus: str | None = None,
    env: dict[str, str] | None = None,
) -> Child:
    """A started child in its own session, stdout and stderr in ``log_dir/NAME.log``."""
    return Child(name, argv, log_dir, env=env, cwd=REPO, cpus=cpus, merge_output=True).start()


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


class Frontend:
    """The frontend under test: ``pids`` maps role (frontend, engine) to pid."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._services: list[Child] = []
        self._dynamo: Dynamo | None = None
        self._vllm: Vllm | None = None
        self.url = ""
        self.pids: dict[str, int] = {}
        self.label = ""

    @classmethod
    async def start(
        cls,
        kind: str,
        scratch: Path,
        *,
        pace: tuple[float, float] | None,
        speedup: float,
        cpus: str | None,
        dynamo_env: dict[str, str] | None = None,
        mocker_args: tuple[str, ...] = (),
    ) -> Frontend:
        """Start the built-in frontend or Dynamo (``dynamo_env``: its frontend's extra
        environment; ``mocker_args``: its mocker's extra arguments); returns once it
        answers."""
        self = cls(kind)
        if kind == "builtin":
            port = reserve_port()
            argv = cli_argv(
                "mock-frontend",
                "--port",
                str(port),
                "--model",
                f"{MODEL_NAME}={MODEL_DIR}",
                log_level=None,
            )
            if pace:
                argv += ["--ttft-ms", str(pace[0]), "--itl-ms", str(pace[1])]
            child = service("frontend", argv, scratch, cpus=cpus)
            self._services.append(child)
            self.url = f"http://127.0.0.1:{port}"
            await wait_http_ok(self.url + "/health", START_TIMEOUT_S, children=[child])
            self.pids = {"frontend": child.pid}
            self.label = "built-in mock frontend" + (
                f" (ttft {pace[0]:g} ms, itl {pace[1]:g} ms)" if pace else " (no pacing)"
            )
        elif kind == "vllm":
            vllm = await start_vllm(
                VLLM_MODEL_DIR, MODEL_NAME, scratch / "vllm", engine_process=True
            )
            self._vllm = vllm
            self.url = vllm.base_url
            engine = children(vllm.child.pid)
            self.pids = {"frontend": vllm.child.pid, **({"engine": engine[-1]} if engine else {})}
            self.label = (
                "vLLM 0.32 (CPU) API server, engine core in its own process "
                f"(tiny random-weight Llama, {VLLM_MODEL_DIR.name})"
            )
        else:
            self._dynamo = await start_dynamo(
                MODEL_DIR,
                MODEL_NAME,
                scratch / "dynamo",
                speedup,
                extra_frontend_env=dynamo_env,
                extra_mocker_args=mocker_args,
            )
            self.url = self._dynamo.base_url
            self.pids = {"frontend": self._dynamo.frontend.pid, "engine": self._dynamo.mocker.pid}
            if cpus is not None:
                for pid in self.pids.values():
                    pin(pid, cpus)
            self.label = f"Dynamo 1.6.1 frontend + mocker (--speedup-ratio {speedup:g})"
            if dynamo_env:
                self.label += ", frontend " + " ".join(f"{k}={v}" for k, v in dynamo_env.items())
        return self

    def stop(self) -> None:
        for child in self._services:
            child.terminate()
        if self._dynamo is not None:
            self._dynamo.stop()
        if self._vllm is not None:
            self._vllm.stop()


NGINX_CONF = """\
{user}worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    keepalive_requests 100000;
    upstream frontend {{
        server {upstream};
        keepalive 256;
        keepalive_requests 100000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://frontend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


async def start_nginx(frontend_url: str, scratch: Path, cpus: str | None) -> tuple[Child, str, int]:
    """nginx in the foreground with a temp prefix; returns its worker's pid."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = scratch / "nginx"
    prefix.mkdir(exist_ok=True)
    port = reserve_port()
    conf = prefix / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            user="user root;\n" if os.geteuid() == 0 else "",
            prefix=prefix,
            port=port,
            upstream=frontend_url.removeprefix("http://"),
        )
    )
    child = service(
        "nginx", [nginx, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"], prefix, cpus=cpus
    )
    url = f"http://127.0.0.1:{port}"
    await wait_http_ok(url + "/v1/models", 30, children=[child])
    workers = children(child.pid)
    return child, url, workers[0] if workers else child.pid


def proxy_models(frontend_kind: str) -> list[dict[str, Any]]:
    """The proxy's model entry for the frontend under test (vLLM's renders its
    template with Jinja2)."""
    if frontend_kind == "vllm":
        return [{"name": MODEL_NAME, "tokenizer": str(VLLM_MODEL_DIR), "template_engine": "jinja2"}]
    return [{"name": MODEL_NAME, "tokenizer": str(MODEL_DIR)}]


async def start_proxy(
    frontend_url: str,
    scratch: Path,
    taps: bool,
    cpus: str | None,
    worker: dict[str, Any] | None = None,
    quick_ack: bool = True,
    frontend_kind: str = "builtin",
):
    """The proxy (with ``SHADOW_PROXY_LOOP_LAG=1``) and, with ``taps``, the two
    reference taps (``worker``: options of the tap worker); returns (child, url,
    worker pid, [(tap, endpoint, topic)])."""
    port = reserve_port()
    tap_list = reference_taps([reserve_endpoint() for _ in TAP_NAMES]) if taps else []
    options: dict[str, Any] = {"worker": worker} if worker and taps else {}
    if not quick_ack:
        options["upstream"] = {"quick_ack": False}
    mapping = proxy_config(
        frontend_url,
        port=port,
        models=proxy_models(frontend_kind) if taps else None,
        taps=tap_list,
        **options,
    )
    conf = write_config(scratch / f"proxy-{'taps' if taps else 'plain'}.yaml", mapping)
    env = {**os.environ, "SHADOW_PROXY_LOOP_LAG": "1"}
    argv = cli_argv("serve", "--config", str(conf), log_level=None)
    child = service("proxy", argv, scratch, cpus=cpus, env=env)
    url = f"http://127.0.0.1:{port}"
    await wait_http_ok(url + "/healthz", START_TIMEOUT_S, children=[child])
    worker = None
    if taps:
        match = re.search(r"tap worker ready \(pid (\d+)\)", child.read_output())
        worker = int(match.group(1)) if match else children(child.pid)[-1]
    endpoints = [(tap["name"], tap["endpoint"], tap["topic"]) for tap in tap_list]
    return child, url, worker, endpoints
