"""The processes helper: reserved ports, waits, child processes (real sockets and
real processes, no mocks)."""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
from pathlib import Path

import pytest
import zmq
from aiohttp import web

from shadow_proxy.devtools.processes import (
    Child,
    ChildExited,
    WaitTimeout,
    bound_socket,
    cli_argv,
    describe_failures,
    reserve_endpoint,
    reserve_port,
    wait_http_ok,
    wait_until,
)

PY = sys.executable


def python(code: str) -> list[str]:
    return [PY, "-c", code]


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


class TestReservePort:
    """A reserved port is bound by a server that asks for it, and by nobody else."""

    def test_a_plain_bind_is_refused(self) -> None:
        port = reserve_port()
        with socket.socket() as s, pytest.raises(OSError, match="in use") as caught:
            s.bind(("127.0.0.1", port))
        assert caught.value.errno == errno.EADDRINUSE

    def test_port_zero_never_hands_it_out(self) -> None:
        port = reserve_port()
        for _ in range(2000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                assert s.getsockname()[1] != port

    def test_servers_with_reuseaddr_bind_it(self) -> None:
        context = zmq.Context()
        publisher = context.socket(zmq.PUB)
        try:
            endpoint = reserve_endpoint()
            publisher.bind(endpoint)
            assert publisher.getsockopt_string(zmq.LAST_ENDPOINT) == endpoint
        finally:
            publisher.close(linger=0)
            context.term()

    async def test_asyncio_server_binds_it(self) -> None:
        port = reserve_port()
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
        try:
            assert server.sockets[0].getsockname()[1] == port
        finally:
            server.close()
            await server.wait_closed()


class TestBoundSocket:
    """An in-process server gets a socket that is already bound: no race at all."""

    async def test_aiohttp_serves_on_it(self) -> None:
        async def hello(_request: web.Request) -> web.Response:
            return web.Response(text="hi")

        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = bound_socket()
        try:
            await web.SockSite(runner, sock).start()
            port = sock.getsockname()[1]
            assert port != 0
            await wait_http_ok(f"http://127.0.0.1:{port}/", 5)
        finally:
            await runner.cleanup()
            sock.close()


class TestWaitUntil:
    """Sync and async predicates; a timeout and an exited child say what failed."""

    async def test_returns_the_truthy_value(self) -> None:
        values = iter([0, None, "", 7])
        assert await wait_until(lambda: next(values), timeout=5) == 7

    async def test_awaits_an_async_predicate(self) -> None:
        calls = []

        async def ready() -> str | None:
            calls.append(1)
            return "yes" if len(calls) == 3 else None

        assert await wait_until(ready, timeout=5) == "yes"
        assert len(calls) == 3

    async def test_timeout_names_what_and_the_last_value(self) -> None:
        queue = [1, 2, 3]
        with pytest.raises(
            WaitTimeout, match=r"^the queue empty: not within 0\.05 s \(last: \[\]\)$"
        ):
            await wait_until(lambda: [x for x in queue if x > 5], 0.05, what="the queue empty")

    async def test_fails_on_timeout(self) -> None:
        with pytest.raises(WaitTimeout, match=r"nothing: not within 0\.05 s"):
            await wait_until(lambda: False, timeout=0.05, what="nothing")

    async def test_default_message_is_the_predicate_source(self) -> None:
        with pytest.raises(WaitTimeout, match=r"lambda: 1 > 2"):
            await wait_until(lambda: 1 > 2, 0.01)

    async def test_runs_once_with_a_zero_timeout(self) -> None:
        calls = []
        with pytest.raises(WaitTimeout):
            await wait_until(lambda: calls.append(1), 0)
        assert calls == [1]

    async def test_an_exited_child_fails_the_wait_at_once(self, tmp_path: Path) -> None:
        child = Child(
            "short", python("import sys; print('bye', file=sys.stderr); sys.exit(3)"), tmp_path
        ).start()
        with pytest.raises(ChildExited, match=r"short exited with status 3[\s\S]*bye"):
            await wait_until(lambda: False, timeout=60, children=[child])
        assert child.crashed and child.exit_status == 3


class TestChild:
    """A child runs in its own session with its output in files; stopping it
    always leaves it reaped."""

    def test_output_goes_to_files(self, tmp_path: Path) -> None:
        code = "import sys; print('out'); print('err', file=sys.stderr)"
        child = Child("c", python(code), tmp_path).start()
        assert child.wait(30) == 0
        assert child.read_output() == "out\n"
        assert child.output_tail() == "err"
        assert (tmp_path / "c.stdout").exists() and (tmp_path / "c.stderr").exists()

    def test_merged_output(self, tmp_path: Path) -> None:
        code = "import sys; print('out', flush=True); print('err', file=sys.stderr)"
        child = Child("m", python(code), tmp_path, merge_output=True).start()
        assert child.wait(30) == 0
        assert child.read_output().split() == ["out", "err"]
        assert child.stdout_path == child.stderr_path == tmp_path / "m.log"

    def test_environment_and_directory(self, tmp_path: Path) -> None:
        code = "import os; print(os.environ['MARK'], os.getcwd())"
        child = Child("e", python(code), tmp_path, env={"MARK": "m1"}, cwd=tmp_path).start()
        assert child.wait(30) == 0
        assert child.read_output().split() == ["m1", str(tmp_path)]

    async def test_sigterm_lets_it_exit_cleanly(self, tmp_path: Path) -> None:
        code = (
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        child = Child("polite", python(code), tmp_path).start()
        await wait_until(lambda: child.read_output(), 30, children=[child])
        assert await child.stop(30) == 0
        assert not child.alive and not child.crashed

    async def test_a_child_ignoring_sigterm_is_killed(self, tmp_path: Path) -> None:
        code = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        child = Child("stubborn", python(code), tmp_path).start()
        await wait_until(lambda: child.read_output(), 30, children=[child])
        assert await child.stop(timeout=0.2) == -signal.SIGKILL
        assert child.exit_status == -signal.SIGKILL

    async def test_kill_takes_the_process_group(self, tmp_path: Path) -> None:
        code = (
            "import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(g.pid, flush=True)\n"
            "time.sleep(60)\n"
        )
        with Child("parent", python(code), tmp_path) as child:
            grandchild = int(await wait_until(lambda: child.read_output().strip(), 30))
        assert not child.alive
        await wait_until(lambda: gone(grandchild), 10, what=f"process {grandchild} gone")

    def test_signal_and_check_alive(self, tmp_path: Path) -> None:
        child = Child("s", python("import time; time.sleep(60)"), tmp_path).start()
        try:
            child.check_alive()
            child.signal(signal.SIGKILL)
            child.process.wait(10)
            with pytest.raises(ChildExited, match="s exited with status -9"):
                child.check_alive()
            child.signal(signal.SIGTERM)  # exited: a no-op, no error
        finally:
            child.kill()

    def test_cpus_pin_through_taskset(self, tmp_path: Path) -> None:
        child = Child(
            "p", python("import os; print(sorted(os.sched_getaffinity(0)))"), tmp_path, cpus="0"
        )
        assert child.argv[:3] == ["taskset", "-c", "0"]
        assert child.start().wait(30) == 0
        assert child.read_output().strip() == "[0]"

    def test_describe_failures_names_the_culprit(self, tmp_path: Path) -> None:
        good = Child("good", python("import time; time.sleep(60)"), tmp_path).start()
        bad = Child("bad", python("import sys; sys.exit('broken')"), tmp_path).start()
        try:
            bad.wait(30)
            with pytest.raises(ChildExited):
                bad.check_alive()
            text = describe_failures([good, bad])
            assert "--- bad (status 1)" in text and "broken" in text
            assert "good" not in text
        finally:
            good.kill()


def test_cli_argv() -> None:
    assert cli_argv("serve", "--config", "x") == [
        PY,
        "-m",
        "shadow_proxy.cli",
        "--log-level",
        "warning",
        "serve",
        "--config",
        "x",
    ]
    assert cli_argv("demo", log_level=None) == [PY, "-m", "shadow_proxy.cli", "demo"]
