"""Start and stop the real Dynamo frontend + mocker (PyPI ai-dynamo 1.6.1) for tests.

No pytest import here: the module is usable from fixtures, benchmarks and scripts.

Dynamo lives in its own venv (``scripts/install-dynamo.sh`` makes
``.dynamo/venv``); ``dynamo_python()`` finds it, or says why it cannot. Both
processes run with the file discovery backend in a per-start scratch folder (a
fresh ``DYN_FILE_KV`` dir, so a mocker killed by an earlier test leaves no stale
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
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DYNAMO_PYTHON = REPO / ".dynamo" / "venv" / "bin" / "python"
INSTALL_HINT = "run scripts/install-dynamo.sh (or make dynamo) to install ai-dynamo 1.6.1"


class DynamoUnavailable(RuntimeError):
    """Dynamo is not installed here; the message says why (use it as a skip reason)."""


class DynamoStartError(RuntimeError):
    """Dynamo did not become ready; the message carries the tail of both logs."""


def dynamo_python() -> Path:
    """The Python of the Dynamo venv: ``$DYNAMO_PYTHON`` or ``.dynamo/venv/bin/python``.

    Raises DynamoUnavailable (with a reason fit for ``pytest.skip``) when absent or broken.
    """
    py = Path(os.environ.get("DYNAMO_PYTHON") or DEFAULT_DYNAMO_PYTHON)
    if not py.exists():
        raise DynamoUnavailable(f"Dynamo not installed: {py} does not exist; {INSTALL_HINT}")
    probe = subprocess.run(
        [str(py), "-c", "import dynamo.frontend, dynamo.mocker"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        raise DynamoUnavailable(
            f"Dynamo venv at {py} cannot import dynamo.frontend/dynamo.mocker: "
            f"{probe.stderr.strip()[-300:]}; {INSTALL_HINT}"
        )
    return py


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dynamo_env(scratch: Path) -> dict[str, str]:
    """Environment shared by the mocker and the frontend."""
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


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(lines[-n:])


@dataclass
class DynamoProcs:
    """A running mocker + frontend pair. ``base_url`` is the frontend's HTTP root."""

    mocker: subprocess.Popen[bytes]
    frontend: subprocess.Popen[bytes]
    base_url: str
    http_port: int
    served_name: str
    scratch: Path
    mocker_log: Path
    frontend_log: Path
    startup_s: float = 0.0
    extra_mockers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list = field(default_factory=list, repr=False)

    def logs_tail(self, n: int = 40) -> str:
        return (
            f"--- mocker log ({self.mocker_log}) ---\n{_tail(self.mocker_log, n)}\n"
            f"--- frontend log ({self.frontend_log}) ---\n{_tail(self.frontend_log, n)}"
        )

    def kill_mocker(self, mocker: subprocess.Popen[bytes] | None = None) -> None:
        """SIGKILL a mocker, the first one by default (to test what clients see
        when the engine dies)."""
        mocker = mocker or self.mocker
        _signal_group(mocker, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            mocker.wait(5)

    def add_mocker(
        self,
        model_dir: Path,
        served_name: str,
        *,
        speedup: float = 1000.0,
        component: str | None = None,
        ready_timeout: float = 60.0,
        extra_mocker_args: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """Start one more mocker behind the same frontend, serving ``model_dir`` as
        ``served_name`` on its own endpoint ``dyn://dynamo.{component}.generate``
        (default: the served name with non-alphanumerics dropped). Waits until the
        frontend answers a one-token chat request for it; stopped with the others.
        """
        component = component or "".join(c for c in served_name if c.isalnum())
        log_path = self.scratch / f"mocker-{component}.log"
        log = open(log_path, "wb")  # noqa: SIM115
        self._logs.append(log)
        mocker = _start_mocker(
            dynamo_python(),
            Path(model_dir).resolve(),
            served_name,
            speedup,
            ("--endpoint", f"dyn://dynamo.{component}.generate", *extra_mocker_args),
            log,
            self.scratch,
        )
        self.extra_mockers.append(mocker)
        try:
            _wait_model(
                self, served_name, (mocker, self.frontend), time.monotonic() + ready_timeout
            )
        except BaseException:
            self.kill_mocker(mocker)
            raise
        return mocker

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM all (mockers first), then SIGKILL whatever is left after ``timeout``."""
        procs = (self.mocker, *self.extra_mockers, self.frontend)
        for p in procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        for f in self._logs:
            with contextlib.suppress(OSError):
                f.close()

    def __enter__(self) -> DynamoProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    # Each process is started in its own session, so its group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def _get_json(url: str, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def start_dynamo(
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
) -> DynamoProcs:
    """Start ``dynamo.mocker`` serving ``model_dir`` as ``served_name`` and ``dynamo.frontend``.

    Waits until ``GET /v1/models`` lists ``served_name`` and a one-token chat
    request succeeds (both mocker and frontend ready), at most ``ready_timeout``
    seconds; on failure stops both and raises DynamoStartError with the log
    tails. ``speedup`` is the mocker's --speedup-ratio: use 100..1000 (0 is not
    instant in 1.6.1). ``extra_frontend_env`` adds variables to the frontend's
    environment only (e.g. ``DYN_REQUEST_TRACE*``). Raises DynamoUnavailable
    when Dynamo is not installed.
    """
    py = dynamo_python()
    model_dir = Path(model_dir).resolve()
    scratch = Path(scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    env = dynamo_env(scratch)
    port = http_port or free_port()
    mocker_log, frontend_log = scratch / "mocker.log", scratch / "frontend.log"
    mlog, flog = open(mocker_log, "wb"), open(frontend_log, "wb")  # noqa: SIM115
    t0 = time.monotonic()
    common = {
        "env": env,
        "cwd": str(scratch),
        "stdin": subprocess.DEVNULL,
        "start_new_session": True,
        "stderr": subprocess.STDOUT,
    }
    mocker = _start_mocker(py, model_dir, served_name, speedup, extra_mocker_args, mlog, scratch)
    frontend = subprocess.Popen(
        [
            str(py),
            "-m",
            "dynamo.frontend",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
            *extra_frontend_args,
        ],
        stdout=flog,
        **{**common, "env": {**env, **(extra_frontend_env or {})}},
    )
    procs = DynamoProcs(
        mocker,
        frontend,
        f"http://127.0.0.1:{port}",
        port,
        served_name,
        scratch,
        mocker_log,
        frontend_log,
        _logs=[mlog, flog],
    )
    try:
        _wait_ready(procs, t0 + ready_timeout)
    except BaseException:
        procs.stop(timeout=5)
        raise
    procs.startup_s = time.monotonic() - t0
    return procs


def _start_mocker(
    py: Path,
    model_dir: Path,
    served_name: str,
    speedup: float,
    extra_args: tuple[str, ...],
    log,
    scratch: Path,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(py),
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(model_dir),
            "--model-name",
            served_name,
            "--speedup-ratio",
            str(speedup),
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dynamo_env(scratch),
        cwd=str(scratch),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_ready(procs: DynamoProcs, deadline: float) -> None:
    _wait_model(procs, procs.served_name, (procs.mocker, procs.frontend), deadline)


def _wait_model(
    procs: DynamoProcs,
    served_name: str,
    watched: tuple[subprocess.Popen[bytes], ...],
    deadline: float,
) -> None:
    probe = json.dumps(
        {
            "model": served_name,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "ping"}],
        }
    ).encode()
    last = "no answer yet"
    while time.monotonic() < deadline:
        for p in watched:
            if p.poll() is not None:
                name = "frontend" if p is procs.frontend else "mocker"
                raise DynamoStartError(
                    f"Dynamo {name} exited with code {p.returncode} during start-up\n"
                    + procs.logs_tail()
                )
        models = _get_json(procs.base_url + "/v1/models")
        if models and any(m.get("id") == served_name for m in models.get("data", [])):
            req = urllib.request.Request(
                procs.base_url + "/v1/chat/completions",
                data=probe,
                headers={"content-type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    if r.status == 200:
                        r.read()
                        return
            except (urllib.error.URLError, OSError) as e:
                last = f"probe chat request failed: {e}"
        else:
            last = f"/v1/models = {models}"
        time.sleep(0.2)
    raise DynamoStartError(
        f"Dynamo did not become ready for model {served_name!r} in time ({last})\n"
        + procs.logs_tail()
    )


if __name__ == "__main__":  # manual check: python tests/dynamo_harness.py [model_dir]
    import sys
    import tempfile

    d = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / ".models" / "deepseek"
    with tempfile.TemporaryDirectory() as tmp, start_dynamo(d, "m", Path(tmp)) as procs:
        print(f"ready in {procs.startup_s:.2f}s at {procs.base_url}")
        print(_get_json(procs.base_url + "/v1/models"))
