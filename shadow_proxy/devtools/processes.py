"""Ports, waits and child processes for the demo, the benchmarks and the tests.

One place for three things every tool that starts the proxy needs:

- **Ports without a bind race.** ``reserve_port`` reserves a loopback port for a
  server in *another* process (the proxy, a tap socket, a frontend): it binds
  port 0, completes one connection to itself and closes the accepted side first,
  which leaves that side in TIME_WAIT on the port. While TIME_WAIT lasts (60 s
  on Linux) the kernel hands the port to nobody binding port 0 or connecting
  out, and a plain ``bind`` to it fails; a server that binds with
  ``SO_REUSEADDR`` (aiohttp and asyncio, uvloop, libzmq, nginx and tokio all do
  on Linux) gets it. The naive "bind port 0, read the number, close" frees the
  port at once for anyone. In-process servers need no number ahead of time:
  ``bound_socket`` hands over a listening socket already bound to port 0
  (``aiohttp.web.SockSite``), which has no race at all.
- **Waiting.** ``wait_until`` polls a sync or async predicate until it returns a
  truthy value, failing with ``WaitTimeout`` that says what was awaited, for how
  long and the last value seen; given children, it fails at once with
  ``ChildExited`` (the tail of their output) when one of them exits.
- **Children.** ``Child`` runs one command in a session of its own with its
  output in files, checks that it lives, signals it, stops it (SIGTERM, then
  SIGKILL of its process group after a timeout) and reads the tail of its
  output. ``cli_argv`` is the argv of ``python -m shadow_proxy.cli ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp

#: Lines of a child's output shown when it fails.
TAIL_LINES = 20
#: How long ``Child.stop`` waits for an exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 15.0


class WaitTimeout(TimeoutError):
    """A ``wait_until`` predicate did not hold in time; the message says what."""


class ChildExited(RuntimeError):
    """A child process exited while it was expected to run; the message holds
    its name, status and the tail of its output."""


# --------------------------------------------------------------------------- ports


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that a server in another process can bind for the
    next 60 s and nobody else gets meanwhile (see the module docstring).

    The server must bind with ``SO_REUSEADDR`` (every server these tools start
    does); a plain bind to the port fails while it is reserved.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.create_connection(address[:2], timeout=5) as client:
            accepted, _ = listener.accept()
            # The side that closes first keeps TIME_WAIT: the accepted one, on
            # the reserved port (the client's port is an ephemeral one).
            accepted.close()
            client.recv(1)  # the peer's FIN: the close has happened
    return address[1]


def reserve_endpoint(host: str = "127.0.0.1") -> str:
    """``tcp://host:PORT`` on a reserved port, for a tap's ZeroMQ socket."""
    return f"tcp://{host}:{reserve_port(host)}"


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on ``host``, port chosen by the kernel: hand it
    to an in-process server (``aiohttp.web.SockSite``); the caller owns it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


# --------------------------------------------------------------------------- waiting


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.01,
    *,
    what: str | None = None,
    children: Sequence[Child] = (),
) -> Any:
    """Poll ``predicate`` (sync, or returning an awaitable) until it returns a
    truthy value, and return that value.

    Runs the predicate at once, then every ``interval`` seconds. Raises
    ``WaitTimeout`` after ``timeout`` seconds, naming ``what`` (default: the
    predicate's source) and the last value seen; raises ``ChildExited`` as soon
    as one of ``children`` has exited. The predicate runs at least once, even
    with a zero timeout.
    """
    deadline = time.monotonic() + timeout
    value: Any = None
    while True:
        for child in children:
            child.check_alive()
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            msg = f"{what or _describe(predicate)}: not within {timeout:g} s (last: {value!r})"
            raise WaitTimeout(msg)
        await asyncio.sleep(interval)


def _describe(predicate: Callable[[], Any]) -> str:
    try:
        source = inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)
    return " ".join(source.split())[:200]


async def http_ok(session: aiohttp.ClientSession, url: str, timeout: float = 2.0) -> bool:
    """True when ``GET url`` answers 200; False while it cannot (yet)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def wait_http_ok(
    url: str, timeout: float, *, children: Sequence[Child] = (), interval: float = 0.05
) -> None:
    """Wait until ``GET url`` answers 200 (a server's readiness), failing as
    ``wait_until`` does (a child that exits fails the wait at once)."""
    async with aiohttp.ClientSession() as session:
        await wait_until(
            lambda: http_ok(session, url),
            timeout,
            interval,
            what=f"GET {url} answering 200",
            children=children,
        )


# --------------------------------------------------------------------------- children


def cli_argv(*args: str, log_level: str | None = "warning") -> list[str]:
    """``python -m shadow_proxy.cli [--log-level L] ARGS``, with this interpreter."""
    level = ["--log-level", log_level] if log_level else []
    return [sys.executable, "-m", "shadow_proxy.cli", *level, *args]


class Child:
    """One child process in a session of its own, its output in files.

    ``start`` runs ``argv`` with stdin closed and stdout and stderr in
    ``log_dir/NAME.stdout`` and ``log_dir/NAME.stderr`` (or both in
    ``log_dir/NAME.log`` with ``merge_output``). ``cpus`` pins it with
    ``taskset`` (which execs: the pid stays the child's). Its own session means
    Ctrl-C reaches only the parent, which stops its children in order;
    ``kill`` takes the whole process group (a proxy's tap worker with it).
    Guarantees: after ``stop`` or ``kill`` the process has exited and been
    reaped, and ``exit_status`` holds its status.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        cpus: str | None = None,
        merge_output: bool = False,
        signal_group: bool = False,
    ) -> None:
        self.name = name
        self.argv = ["taskset", "-c", cpus, *argv] if cpus is not None else list(argv)
        self.log_dir = Path(log_dir)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.merge_output = merge_output
        #: Signals from ``signal``/``stop`` go to the whole process group.
        self.signal_group = signal_group
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_status: int | None = None
        #: It exited on its own, before it was stopped.
        self.crashed = False

    @property
    def stdout_path(self) -> Path:
        """Where its stdout goes."""
        return self.log_dir / (f"{self.name}.log" if self.merge_output else f"{self.name}.stdout")

    @property
    def stderr_path(self) -> Path:
        """Where its stderr goes (its stdout's file with ``merge_output``)."""
        return self.stdout_path if self.merge_output else self.log_dir / f"{self.name}.stderr"

    @property
    def pid(self) -> int:
        """Its process id (it must have been started)."""
        assert self.process is not None, f"{self.name} was not started"
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Started and not exited yet."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> Child:
        """Start the process (once); returns ``self``."""
        assert self.process is None, f"{self.name} was started already"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self.env if self.env is not None else dict(os.environ)
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        out: IO[bytes]
        with contextlib.ExitStack() as files:
            out = files.enter_context(self.stdout_path.open("wb"))
            err = out if self.merge_output else files.enter_context(self.stderr_path.open("wb"))
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                env=env,
                cwd=self.cwd,
            )
        return self

    def check_alive(self) -> None:
        """Raise ``ChildExited`` (with the tail of its output) if it has exited."""
        assert self.process is not None, f"{self.name} was not started"
        status = self.process.poll()
        if status is not None:
            self.exit_status = status
            self.crashed = True
            msg = (
                f"{self.name} exited with status {status} while it should run; last lines:\n"
                f"{self.output_tail() or '(no output)'}"
            )
            raise ChildExited(msg)

    def signal(self, sig: int) -> None:
        """Send ``sig`` (to the group with ``signal_group``); a no-op once it exited."""
        if not self.alive:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.signal_group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGCONT (it may be stopped), SIGTERM, wait up to ``timeout``, then
        ``kill``. Blocks; returns the exit status."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        return self.reap(timeout)

    def reap(self, timeout: float) -> int:
        """Wait up to ``timeout`` for it to exit, then ``kill``. Blocks; returns
        the exit status."""
        process = self.process
        assert process is not None, f"{self.name} was not started"
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
        if process.poll() is None:
            self.kill()
        self.exit_status = process.returncode
        return process.returncode

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """``terminate`` without blocking the event loop."""
        return await asyncio.to_thread(self.terminate, timeout)

    def kill(self) -> None:
        """SIGKILL the process group and reap the child (a no-op if not started)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        if self.exit_status is None:
            self.exit_status = process.returncode

    def wait(self, timeout: float) -> int:
        """Block until it exits on its own (``subprocess.TimeoutExpired`` after ``timeout``)."""
        assert self.process is not None, f"{self.name} was not started"
        status = self.process.wait(timeout)
        self.exit_status = status
        return status

    def output_tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` of its stderr (its log with ``merge_output``)."""
        try:
            text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def read_output(self) -> str:
        """Everything it wrote to stdout so far (its log with ``merge_output``)."""
        try:
            return self.stdout_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> Child:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def describe_failures(children: Sequence[Child], lines: int = 12) -> str:
    """The output tails of the children that exited on their own, or of every
    child if none did (for a message when a run fails)."""
    culprits = [c for c in children if c.crashed] or list(children)
    parts = []
    for child in culprits:
        status = child.exit_status if child.exit_status is not None else "running"
        tail = child.output_tail(lines) or "(empty)"
        parts.append(f"--- {child.name} (status {status}), last lines of output:\n{tail}")
    return "\n".join(parts)
