"""Real processes and raw sockets for the serving tests.

- ``Proxy``: ``shadow-proxy serve`` as a ``processes.Child`` with its own
  config file and log file, started and stopped as an operator would.
- ``RawFrontend``: an asyncio TCP server playing the frontend that records
  every request exactly as the bytes arrived (request line, header block,
  body) and answers a fixed response; it never sends ``100 Continue``.
- ``raw_exchange``: send bytes on a fresh connection, read until the server
  closes it (or a timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs

from shadow_proxy.devtools.processes import Child, cli_argv, wait_http_ok

OK_BODY = b'{"object":"list","data":[]}'
OK_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(OK_BODY), OK_BODY)
)


def config_text(
    port: int, upstream: str, extra: str = "", *, grace: float = 5, listen: str = ""
) -> str:
    """A config file's text; ``listen`` adds keys to the listen mapping."""
    listen = f", {listen}" if listen else ""
    return (
        "schema_version: 1\n"
        f"listen: {{host: 127.0.0.1, port: {port}{listen}}}\n"
        f"upstream: {{url: '{upstream}'}}\n"
        f"shutdown_grace_s: {grace}\n" + extra
    )


class Proxy:
    """``shadow-proxy serve`` in a child process (its output in ``log_path``).

    ``wrapper`` runs before the command (``prlimit --nofile=...``: a program
    that execs it, so the pid stays the proxy's).
    """

    def __init__(
        self,
        tmp_path: Path,
        text: str,
        *,
        log_level: str = "info",
        name: str = "proxy",
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ):
        self.config_path = tmp_path / f"{name}.yaml"
        self.config_path.write_text(text)
        port = re.search(r"port: (\d+)", text)
        self.port = int(port.group(1)) if port else 0
        self.url = f"http://127.0.0.1:{self.port}"
        argv = cli_argv("serve", "--config", str(self.config_path), log_level=log_level)
        env = {**os.environ, **(env or {})}
        self.child = Child(name, [*wrapper, *argv], tmp_path, env=env, merge_output=True)
        self.log_path = self.child.stdout_path

    def start(self) -> Proxy:
        self.child.start()
        return self

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.child.process is not None, "the proxy was not started"
        return self.child.process

    @property
    def pid(self) -> int:
        return self.child.pid

    def log(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Until ``/healthz`` answers 200 (the taps started); fails at once, with
        the tail of its log, if the proxy exits meanwhile."""
        await wait_http_ok(self.url + "/healthz", timeout, children=[self.child])

    async def metrics(self) -> str:
        answer = await raw_exchange(
            self.port, b"GET /metrics HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n", timeout=5
        )
        return answer.partition(b"\r\n\r\n")[2].decode()

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status (None if never started)."""
        if self.child.process is None:
            return None
        return self.child.terminate(timeout)


def sample(metrics_text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        key, _, value = line.rpartition(" ")
        series, _, rest = key.partition("{")
        got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if series == name and got == want:
            return float(value)
    return 0.0


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def raw_exchange(port: int, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; everything read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def raw_response(port: int, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; one response (by its Content-Length),
    without waiting for the server to close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            body = await reader.readexactly(int(length.group(1))) if length else b""
        return head + body
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@attrs.define
class Received:
    """One request as the frontend's socket got it."""

    request_line: bytes
    headers: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.headers.split(b"\r\n"):
            key, sep, value = line.partition(b":")
            if sep and key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None


class RawFrontend:
    """A frontend on a raw socket: records each request's bytes, answers ``response``."""

    def __init__(self, response: bytes = OK_RESPONSE, *, close_after: bool = False):
        self.response = response
        #: Close the connection after each response (a frontend that breaks).
        self.close_after = close_after
        self.requests: list[Received] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RawFrontend:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, headers = head[:-4].partition(b"\r\n")
                received = Received(request_line, headers, b"")
                length = received.header("content-length")
                if length is not None:
                    received.body = await reader.readexactly(int(length))
                elif (received.header("transfer-encoding") or "").lower() == "chunked":
                    received.body = await _read_chunked(reader)
                self.requests.append(received)
                writer.write(self.response)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        body += (await reader.readexactly(size + 2))[:-2]
        if size == 0:
            return body
