"""The live service's judge process: the window's latency verdicts (the
bootstrap of ``verdicts.judge``) computed away from the serving loop.

The bootstrap is numpy work of up to a second on a loaded core, and in a
thread of the serving process it holds the interpreter lock long enough to
make ``/metrics`` wait (p99 240 ms, max 596 ms over 30 minutes). So the
service judges in a child process instead:

- the service prepares each refresh in its own process (``Window.prepare``:
  the counts, and the latency columns of at most ``window.JUDGED_PAIRS``
  values each) and sends only the ``window.JudgeRequest`` (plain values and
  float64 bytes: at most 2,000 x 6 x 8 bytes, about 100 kB) over a Unix
  socket; the child answers with the plain verdict numbers
  (``window.Latencies``);
- the child is started with ``lifeline.spawn``: it ends when the service
  does, a SIGKILL of the service included (no orphan);
- a child that dies (or does not answer within ``ANSWER_S``) is counted
  (``shadow_replay_judge_crashes_total``), said once, and started again at the
  next refresh; the service goes on (the gauges keep their last values until
  a refresh succeeds, and ``/healthz`` says how long ago that was).

A frame is a 4-byte big-endian length and a pickle. The socket lives in a
directory only this user can open (``tempfile.mkdtemp``), and the service
accepts one connection per child it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadow_proxy import lifeline
from shadow_proxy.replay.window import JudgeRequest, Latencies, judge_latencies

#: How long the child may take to start (import numpy) and connect.
START_S = 60.0
#: How long one judging may take before the child is called stuck and ended.
ANSWER_S = 60.0
#: How long the child may take to end once its socket is closed (then it is killed).
STOP_S = 2.0
#: How often a starting child is checked for having exited.
POLL_S = 0.1
HEADER = struct.Struct(">I")


class JudgeFailed(Exception):
    """The judge process died or did not answer; it is started again next time."""


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def child_main(path: str) -> int:
    """The judge process (``lifeline.spawn``'s target): answer each request on
    the socket at ``path`` until the service closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the service's to handle
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        while True:
            header = _read_exactly(sock, HEADER.size)
            if header is None:
                return 0
            body = _read_exactly(sock, HEADER.unpack(header)[0])
            if body is None:
                return 0
            request: JudgeRequest = pickle.loads(body)
            answer = pickle.dumps(judge_latencies(request))
            sock.sendall(HEADER.pack(len(answer)) + answer)


class JudgeProcess:
    """The service's side: ``judge`` a request in the child, started on demand."""

    def __init__(self, say: Callable[[str], None], on_crash: Callable[[], None]) -> None:
        self._say = say
        self._on_crash = on_crash
        self.crashes = 0
        self._dir: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connected: asyncio.Future[tuple[Any, Any]] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def _start(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        self._dir = Path(tempfile.mkdtemp(prefix="shadow-judge-"))
        path = str(self._dir / "judge.sock")
        connected: asyncio.Future[tuple[Any, Any]] = loop.create_future()
        self._connected = connected

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if connected.done():  # one connection per child
                writer.close()
            else:
                connected.set_result((reader, writer))

        self._server = await asyncio.start_unix_server(accept, path)
        self._process = lifeline.spawn((__name__, "child_main"), (path,))
        deadline = loop.time() + START_S
        while not connected.done():  # or it exited, or START_S passed
            if self._process.poll() is not None or loop.time() > deadline:
                msg = f"the judge process did not connect within {START_S:g} s"
                raise JudgeFailed(msg)
            await asyncio.wait({connected}, timeout=POLL_S)
        self._server.close()  # no other connection from now on
        reader, writer = connected.result()
        return reader, writer

    async def judge(self, request: JudgeRequest) -> Latencies:
        """The latency verdicts of ``request``; ``JudgeFailed`` when the child
        died or hung (it is counted, said the first time, and ended)."""
        try:
            if self._stream is None:
                self._stream = await self._start()
            reader, writer = self._stream
            body = pickle.dumps(request)
            writer.write(HEADER.pack(len(body)) + body)
            await writer.drain()
            async with asyncio.timeout(ANSWER_S):
                size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
                answer: Latencies = pickle.loads(await reader.readexactly(size))
            return answer
        except (OSError, EOFError, TimeoutError, JudgeFailed) as exc:
            code = await self.aclose()
            self.crashes += 1
            self._on_crash()
            if self.crashes == 1:
                self._say(
                    f"the judge process failed ({type(exc).__name__}, exit status {code}); "
                    "it is started again at the next refresh (shadow_replay_judge_crashes_total "
                    "counts this, it is not said again)"
                )
            raise JudgeFailed(str(exc)) from exc

    async def aclose(self) -> int | None:
        """End the child (closing its socket ends it; a hung one is killed);
        its exit status."""
        code, connected = None, self._stream is not None
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream[1].close()
            self._stream = None
        if self._connected is not None and not self._connected.done():
            self._connected.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._process is not None:
            process, self._process = self._process, None
            if not connected:  # still starting: it would not see the socket close
                with contextlib.suppress(OSError):
                    process.terminate()
            code = await asyncio.to_thread(lifeline.reap, process, STOP_S)
            if code is None:
                process.kill()
                code = await asyncio.to_thread(lifeline.reap, process)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return code
