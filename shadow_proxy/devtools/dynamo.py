"""The real Dynamo frontend and mocker (PyPI ai-dynamo 1.6.1), started for the
benchmarks and the tests.

Dynamo lives in its own virtual environment (``scripts/install-dynamo.sh``, or
``make dynamo``, makes ``.dynamo/venv``); ``dynamo_python`` finds it or says why
it cannot. ``start_dynamo`` starts a mocker and a frontend as ``processes.Child``
children with the file discovery backend in a scratch folder of their own (a
fresh ``DYN_FILE_KV`` directory, so a mocker killed earlier leaves no stale
registration behind), the TCP request plane, the ZMQ event plane, every
advertised host on 127.0.0.1, and ``HOME``/``TMPDIR`` inside the scratch folder
(Dynamo caches the model card under ``$HOME/.cache/dynamo``).

Facts about 1.6.1 worth knowing when writing tests against it:

- ``max_tokens`` is required by the mocker: a request without it gets HTTP 400
  ``max_output_tokens (or max_tokens) is required by the mocker worker``.
- ``nvext: {"annotations": ["formatted_prompt", "token_ids"]}`` on a streaming
  request makes the frontend emit ``event: formatted_prompt`` / ``event: token_ids``
  SSE comment events with the rendered prompt and the prompt's token ids.
- The ZMQ event-plane PUB sockets bind 0.0.0.0 on ephemeral ports (hard-coded in
  1.6.1); they advertise 127.0.0.1 via ``DYN_EVENT_PLANE_HOST``. The HTTP
  listener and the TCP request plane bind 127.0.0.1 only.
- ``--speedup-ratio`` 0 is not instant in 1.6.1: use 1 to 1000.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from shadow_proxy.devtools.processes import (
    Child,
    ChildExited,
    WaitTimeout,
    reserve_port,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DYNAMO_PYTHON = REPO / ".dynamo" / "venv" / "bin" / "python"
INSTALL_HINT = "run scripts/install-dynamo.sh (or make dynamo) to install ai-dynamo 1.6.1"
#: The environment variable that names another Dynamo interpreter.
DYNAMO_PYTHON_ENV = "DYNAMO_PYTHON"


class DynamoUnavailable(RuntimeError):
    """Dynamo is not installed here; the message says why and how to install it."""


class DynamoStartError(RuntimeError):
    """Dynamo did not become ready; the message carries the tail of every log."""


def dynamo_python() -> Path:
    """The Python of the Dynamo venv: ``$DYNAMO_PYTHON`` or ``.dynamo/venv/bin/python``.

    Raises ``DynamoUnavailable`` when it is absent or cannot import Dynamo.
    """
    py = Path(os.environ.get(DYNAMO_PYTHON_ENV) or DEFAULT_DYNAMO_PYTHON)
    if not py.exists():
        msg = f"Dynamo not installed: {py} does not exist; {INSTALL_HINT}"
        raise DynamoUnavailable(msg)
    probe = subprocess.run(
        [str(py), "-c", "import dynamo.frontend, dynamo.mocker"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        msg = (
            f"Dynamo venv at {py} cannot import dynamo.frontend/dynamo.mocker: "
            f"{probe.stderr.strip()[-300:]}; {INSTALL_HINT}"
        )
        raise DynamoUnavailable(msg)
    return py


def dynamo_env(scratch: Path) -> dict[str, str]:
    """The environment of the mockers and the frontend (directories created)."""
    home, tmp, kv = scratch / "home", scratch / "tmp", scratch / "discovery"
    for d in (home, tmp, kv):
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "ETCD_", "NATS_"))}
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(kv),
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="zmq",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_HTTP_HOST="127.0.0.1",
        DYN_SELF_HOST_METADATA="0",  # model card via the shared discovery dir; no system port
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class Dynamo:
    """A running frontend and its mockers. ``base_url`` is the frontend's HTTP root."""

    def __init__(
        self, python: Path, frontend: Child, base_url: str, served_name: str, scratch: Path
    ) -> None:
        self.python = python
        self.frontend = frontend
        self.mockers: list[Child] = []
        self.base_url = base_url
        self.served_name = served_name
        self.scratch = scratch
        #: Seconds from the first process start to the first ready answer.
        self.startup_s = 0.0

    @property
    def mocker(self) -> Child:
        """The first mocker (the one ``start_dynamo`` started)."""
        return self.mockers[0]

    @property
    def children(self) -> list[Child]:
        """The mockers, then the frontend: the order they stop in."""
        return [*self.mockers, self.frontend]

    def logs_tail(self, lines: int = 40) -> str:
        """The last lines of every process's log, for an error message."""
        return "\n".join(
            f"--- {child.name} log ({child.stdout_path}) ---\n{child.output_tail(lines)}"
            for child in self.children
        )

    def start_engine(self, name: str, argv: list[str]) -> Child:
        """Start one more engine process (``argv``, in Dynamo's interpreter and
        environment) behind the same frontend; stopped with the others. A
        mocker, or a test's own worker (a recording or a scripted backend)."""
        engine = Child(
            name,
            argv,
            self.scratch,
            env=dynamo_env(self.scratch),
            cwd=self.scratch,
            merge_output=True,
            signal_group=True,
        )
        self.mockers.append(engine.start())
        return engine

    async def add_engine(
        self, name: str, argv: list[str], served_name: str, ready_timeout: float = 60.0
    ) -> Child:
        """``start_engine``, then wait until the frontend answers a one-token chat
        request for ``served_name``; on failure it is killed and
        ``DynamoStartError`` says why."""
        engine = self.start_engine(name, argv)
        try:
            await self.wait_model(served_name, [engine, self.frontend], ready_timeout)
        except BaseException:
            engine.kill()
            raise
        return engine

    def start_mocker(
        self,
        model_dir: Path,
        served_name: str,
        *,
        speedup: float,
        component: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Child:
        """Start one more mocker serving ``model_dir`` as ``served_name`` (on
        ``dyn://dynamo.{component}.generate`` when ``component`` is given)."""
        endpoint = ("--endpoint", f"dyn://dynamo.{component}.generate") if component else ()
        argv = [
            str(self.python),
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(Path(model_dir).resolve()),
            "--model-name",
            served_name,
            "--speedup-ratio",
            str(speedup),
            *endpoint,
            *extra_args,
        ]
        return self.start_engine(f"mocker-{component}" if component else "mocker", argv)

    async def add_mocker(
        self,
        model_dir: Path,
        served_name: str,
        *,
        speedup: float = 1000.0,
        component: str | None = None,
        ready_timeout: float = 60.0,
        extra_mocker_args: tuple[str, ...] = (),
    ) -> Child:
        """Start one more mocker behind the same frontend, serving ``model_dir``
        as ``served_name`` on its own endpoint (``component`` defaults to the
        served name without non-alphanumerics). Returns once the frontend
        answers a one-token chat request for it; on failure it is killed and
        ``DynamoStartError`` says why. Stopped with the others."""
        component = component or "".join(c for c in served_name if c.isalnum())
        mocker = self.start_mocker(
            model_dir,
            served_name,
            speedup=speedup,
            component=component,
            extra_args=extra_mocker_args,
        )
        try:
            await self.wait_model(served_name, [mocker, self.frontend], ready_timeout)
        except BaseException:
            self.kill_mocker(mocker)
            raise
        return mocker

    @property
    def http_port(self) -> int:
        """The frontend's HTTP port."""
        return int(self.base_url.rsplit(":", 1)[1])

    def kill_mocker(self, mocker: Child | None = None) -> None:
        """SIGKILL a mocker (the first by default), to see what clients get
        when the engine dies. Blocks until it is reaped."""
        (mocker or self.mocker).kill()

    async def wait_model(self, served_name: str, watched: list[Child], timeout: float) -> None:
        """Wait until ``/v1/models`` lists ``served_name`` and a one-token chat
        request for it succeeds; ``DynamoStartError`` (with the logs) when a
        watched process exits or ``timeout`` passes."""
        probe = {
            "model": served_name,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "ping"}],
        }
        last = ["no answer yet"]

        async def ready(session: aiohttp.ClientSession) -> bool:
            try:
                async with session.get(self.base_url + "/v1/models") as r:
                    models = await r.json(content_type=None) if r.status == 200 else None
                listed = isinstance(models, dict) and any(
                    m.get("id") == served_name for m in models.get("data", [])
                )
                if not listed:
                    last[0] = f"/v1/models = {models}"
                    return False
                async with session.post(self.base_url + "/v1/chat/completions", json=probe) as r:
                    await r.read()
                    last[0] = f"probe chat request answered {r.status}"
                    return r.status == 200
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                last[0] = f"{type(e).__name__}: {e}"
                return False

        timeout_per_call = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout_per_call) as session:
            try:
                await wait_until(
                    lambda: ready(session),
                    timeout,
                    0.2,
                    what=f"Dynamo serving {served_name!r}",
                    children=watched,
                )
            except ChildExited as e:
                msg = f"Dynamo exited during start-up: {e}\n{self.logs_tail()}"
                raise DynamoStartError(msg) from e
            except WaitTimeout as e:
                msg = f"{e} ({last[0]})\n{self.logs_tail()}"
                raise DynamoStartError(msg) from e

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every process (mockers first), SIGKILL what is left after
        ``timeout``. Blocks; every process has exited when it returns."""
        started = [child for child in self.children if child.process is not None]
        for child in started:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in started:
            child.reap(max(0.1, deadline - time.monotonic()))

    async def aclose(self, timeout: float = 10.0) -> None:
        """``stop`` without blocking the event loop."""
        await asyncio.to_thread(self.stop, timeout)


def _prepare(scratch: Path) -> tuple[Path, Path]:
    """Dynamo's interpreter (checked: it imports Dynamo) and the scratch folder."""
    python = dynamo_python()
    scratch = scratch.resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    return python, scratch


async def start_frontend(
    served_name: str,
    scratch: Path,
    *,
    http_port: int | None = None,
    extra_frontend_args: tuple[str, ...] = (),
    extra_frontend_env: Mapping[str, str] | None = None,
) -> Dynamo:
    """Start ``dynamo.frontend`` alone (on ``http_port``, default a reserved
    port), for engines the caller adds (``Dynamo.add_engine``); returns at once.
    Raises ``DynamoUnavailable`` when Dynamo is not installed."""
    python, scratch = await asyncio.to_thread(_prepare, Path(scratch))
    port = http_port or reserve_port()
    argv = [
        str(python),
        "-m",
        "dynamo.frontend",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(port),
        *extra_frontend_args,
    ]
    frontend = Child(
        "frontend",
        argv,
        scratch,
        env={**dynamo_env(scratch), **(extra_frontend_env or {})},
        cwd=scratch,
        merge_output=True,
        signal_group=True,
    )
    dynamo = Dynamo(python, frontend, f"http://127.0.0.1:{port}", served_name, scratch)
    frontend.start()
    return dynamo


async def start_dynamo(
    model_dir: Path,
    served_name: str,
    scratch: Path,
    speedup: float = 1000.0,
    *,
    http_port: int | None = None,
    ready_timeout: float = 90.0,
    extra_mocker_args: tuple[str, ...] = (),
    extra_frontend_args: tuple[str, ...] = (),
    extra_frontend_env: Mapping[str, str] | None = None,
) -> Dynamo:
    """Start ``dynamo.mocker`` serving ``model_dir`` as ``served_name`` and
    ``dynamo.frontend`` on ``http_port`` (default: a reserved port).

    Returns once ``GET /v1/models`` lists ``served_name`` and a one-token chat
    request succeeds (mocker and frontend both ready), within ``ready_timeout``
    seconds; on failure every process is stopped and ``DynamoStartError`` holds
    the log tails. ``speedup`` is the mocker's ``--speedup-ratio`` (1 to 1000).
    ``extra_frontend_env`` adds variables to the frontend's environment only
    (e.g. ``DYN_REQUEST_TRACE*``).
    Raises ``DynamoUnavailable`` when Dynamo is not installed.
    """
    started = time.monotonic()
    dynamo = await start_frontend(
        served_name,
        scratch,
        http_port=http_port,
        extra_frontend_args=extra_frontend_args,
        extra_frontend_env=extra_frontend_env,
    )
    try:
        dynamo.start_mocker(model_dir, served_name, speedup=speedup, extra_args=extra_mocker_args)
        await dynamo.wait_model(served_name, dynamo.children, ready_timeout)
    except BaseException:
        await dynamo.aclose(timeout=5)
        raise
    dynamo.startup_s = time.monotonic() - started
    return dynamo
