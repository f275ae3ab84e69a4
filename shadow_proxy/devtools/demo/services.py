"""The processes of a demo run and the waits on them.

``builtin_frontends`` runs around all the runs of one demo (the primary) and
around the replay run (its candidate and baseline): it starts ``shadow-proxy
mock-frontend`` processes on reserved ports, yields their URLs once they
answer ``/health`` and stops them (SIGTERM) when done, keeping their exit
status. ``run_tool`` runs a tool (``shadow-trace``, ``shadow-replay``) to its
end. ``check_frontend``
runs once when ``--frontend URL`` names a running one: it fails early, saying
why, when that frontend does not answer or does not serve the model.
``wait_for_run`` is the demo's wait: it fails as soon as one of the run's
processes exits, or after its timeout (or, when the wait is not fatal, says so
and lets the run count what arrived).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from shadow_proxy.devtools.demo.runs import DemoError
from shadow_proxy.devtools.processes import (
    Child,
    WaitTimeout,
    cli_argv,
    describe_failures,
    reserve_port,
    wait_until,
)

#: Start-up budget of one process (the proxy's tap worker loads tokenizers).
STARTUP_TIMEOUT_S = 90.0
#: How long a process may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0
POLL_S = 0.05
TAIL_LINES = 12


async def wait_for_run(
    what: str,
    check: Callable[[], Any],
    children: Sequence[Child],
    timeout: float,
    *,
    fatal: bool = True,
) -> Any:
    """Poll the coroutine function ``check`` until it returns a truthy value.

    Raises ``ChildExited`` when a child exits, ``WaitTimeout`` when ``timeout``
    passes (unless not ``fatal``: then it says so on stderr and returns None).
    """
    try:
        return await wait_until(check, timeout, POLL_S, what=what, children=children)
    except WaitTimeout as e:
        if fatal:
            raise
        print(f"demo: {e}; counting what arrived", file=sys.stderr)
        return None


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    """The JSON at ``url``, or None if it cannot be had (yet)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
            if response.status != 200:
                return None
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


@attrs.frozen
class FrontendKnobs:
    """How a built-in frontend behaves: its pacing and its divergence."""

    ttft_ms: float
    itl_ms: float
    diverge_fraction: float = 0.0
    diverge_at: int = 0

    def argv(self) -> list[str]:
        argv = ["--ttft-ms", str(self.ttft_ms), "--itl-ms", str(self.itl_ms)]
        if self.diverge_fraction:
            argv += [
                "--diverge-fraction",
                str(self.diverge_fraction),
                "--diverge-at",
                str(self.diverge_at),
            ]
        return argv

    def describe(self) -> str:
        text = f"ttft {self.ttft_ms:g} ms, itl {self.itl_ms:g} ms"
        if self.diverge_fraction:
            text += f", {self.diverge_fraction:.0%} diverging at token {self.diverge_at}"
        return text


@contextlib.asynccontextmanager
async def builtin_frontends(
    models: dict[str, Path],
    knobs: dict[str, FrontendKnobs],
    log_dir: Path,
    statuses: dict[str, int],
) -> AsyncIterator[dict[str, str]]:
    """Run one ``shadow-proxy mock-frontend`` per entry of ``knobs`` (by name), each
    on a reserved port, all at once; yields their base URLs by name once each
    answers ``/health``. On the way out each is stopped (SIGTERM) and its exit
    status goes to ``statuses[name]``."""
    children: dict[str, Child] = {}
    urls: dict[str, str] = {}
    for name, knob in knobs.items():
        port = reserve_port()
        argv = cli_argv("mock-frontend", "--host", "127.0.0.1", "--port", str(port))
        for model, path in models.items():
            argv += ["--model", f"{model}={path}"]
        children[name] = Child(name, [*argv, *knob.argv()], log_dir)
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for child in children.values():
            child.start()
        async with aiohttp.ClientSession() as session:
            for name, url in urls.items():
                await wait_for_run(
                    f"the built-in frontend {name!r} answering /health",
                    functools.partial(get_json, session, url + "/health"),
                    list(children.values()),
                    STARTUP_TIMEOUT_S,
                )
        yield urls
    except Exception:
        print_tails(list(children.values()))
        raise
    finally:
        for name, child in children.items():
            status = await child.stop(STOP_TIMEOUT_S)
            statuses[name] = status
            if status != 0:
                print(
                    f"demo: the built-in frontend {name!r} exited with status {status}",
                    file=sys.stderr,
                )


async def run_tool(name: str, argv: Sequence[str], log_dir: Path, timeout: float) -> Child:
    """Run a command to its end (a tool: ``shadow-trace``, ``shadow-replay``);
    returns the exited child (its ``exit_status``; killed after ``timeout``)."""
    child = Child(name, argv, log_dir).start()
    try:
        await asyncio.to_thread(child.reap, timeout)
    finally:
        child.kill()
    return child


async def check_frontend(url: str, model: str) -> None:
    """Fail early, saying why, when a given frontend does not answer or does
    not serve ``model``."""
    async with aiohttp.ClientSession() as session:
        listing = await get_json(session, url + "/v1/models")
    if listing is None:
        msg = f"the frontend at {url} does not answer GET /v1/models"
        raise DemoError(msg)
    data = listing.get("data") if isinstance(listing, dict) else None
    served = [m.get("id") for m in data or [] if isinstance(m, dict)]
    if served and model not in served:
        msg = f"the frontend at {url} does not serve {model!r} (it serves {served}); pass --model"
        raise DemoError(msg)


def print_tails(children: Sequence[Child]) -> None:
    """The last lines of stderr of the children that exited on their own, or of
    every child if none did."""
    print(describe_failures(children, TAIL_LINES), file=sys.stderr)
