"""The processes of a demo run and the waits on them.

``builtin_frontend`` runs around all the runs of one demo: it starts
``shadow-proxy mock-frontend`` on a reserved port, yields its URL once it
answers ``/health`` and stops it (SIGTERM) when the demo ends. ``check_frontend``
runs once when ``--frontend URL`` names a running one: it fails early, saying
why, when that frontend does not answer or does not serve the model.
``wait_for_run`` is the demo's wait: it fails as soon as one of the run's
processes exits, or after its timeout (or, when the wait is not fatal, says so
and lets the run count what arrived).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

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


@contextlib.asynccontextmanager
async def builtin_frontend(
    models: dict[str, Path], ttft_ms: float, itl_ms: float, log_dir: Path
) -> AsyncIterator[str]:
    """Run ``shadow-proxy mock-frontend`` on a free port; yields its base URL."""
    port = reserve_port()
    argv = cli_argv("mock-frontend", "--host", "127.0.0.1", "--port", str(port))
    for name, path in models.items():
        argv += ["--model", f"{name}={path}"]
    argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    child = Child("frontend", argv, log_dir)
    url = f"http://127.0.0.1:{port}"
    child.start()
    try:
        async with aiohttp.ClientSession() as session:
            await wait_for_run(
                "the built-in frontend answering /health",
                lambda: get_json(session, url + "/health"),
                [child],
                STARTUP_TIMEOUT_S,
            )
        yield url
    except Exception:
        print_tails([child])
        raise
    finally:
        status = await child.stop(STOP_TIMEOUT_S)
        if status != 0:
            print(f"demo: the built-in frontend exited with status {status}", file=sys.stderr)


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
