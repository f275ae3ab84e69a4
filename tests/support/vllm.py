"""The rule for tests that need the real vLLM (marker ``vllm``) and the fleet
they share: vLLM 0.32 servers started once per test session, in the background
as soon as the session has collected a ``vllm`` test, stopped at its end. Only
the servers the collected tests name are started, one after the other (each
once the one before it serves: a start takes 1-3 minutes of both cores, and
several at once slow each other down); a test's first servers are ready first,
the later ones start while it runs. A server a test waits for and that has
not started yet starts next. Under pytest-xdist (``make test``) one worker runs
every ``vllm`` test (the files ``fleet_file`` names), first
(``tests/conftest.py``), and the fleet starts at its first ``ready``.

A test names its servers on its marker: ``pytest.mark.vllm("llama",
"llama-noisy")``; a bare ``vllm`` marker means ``DEFAULT_SERVERS``. A server a
test asks for that was not named starts when asked.

The fleet (``.models/`` dirs from ``devtools/tiny_llama.py``; every server also
answers to ``llama``, so that any of them is a replay candidate for records of
``llama``):

- ``llama``: the primary. Seed-0 weights, the DeepSeek-format template (openai
  content format), 1 GiB of KV cache (8,192 blocks of 128 tokens), tools on;
- ``llama-tools``: the same weights under the Hermes tool template (string
  content format), 192 blocks of KV cache (191 usable), tools on. Same weights
  as ``llama``: the A/A replay's twin, and the small cache of the KV test;
- ``llama-other``: seed-1 weights, the changed candidate;
- ``llama-noisy``: ``llama``'s weights perturbed by small noise (the scoring
  test's slightly worse candidate).

A test takes a server with ``await vllm_fleet.ready(name)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.devtools.vllm import (
    Vllm,
    VllmStartError,
    VllmUnavailable,
    launch_vllm,
    queued,
    vllm_python,
)
from tests.support import MODELS_DIR

#: Set to 1 to skip the tests that need vLLM (developers without it); ignored under CI.
SKIP_VLLM_ENV = "SHADOW_PROXY_SKIP_VLLM"

FLEET: dict[str, dict[str, Any]] = {
    "llama": {"kv_cache_gib": 1, "tools": True},
    "llama-tools": {"num_blocks": 192, "tools": True},
    # Prompt-token details: the closed-loop replay reports the cached share per turn.
    "llama-other": {"extra_args": ("--enable-prompt-tokens-details",)},
    "llama-noisy": {},
}
#: What a bare ``vllm`` marker needs.
DEFAULT_SERVERS = ("llama", "llama-tools", "llama-other")


#: The xdist unit of work that holds every ``vllm`` test (``tests/conftest.py``).
FLEET_SCOPE = "vllm-fleet"


def fleet_file(nodeid: str) -> bool:
    """The test file of ``nodeid`` is one of the fleet's: an integration test
    file with ``vllm`` in its name (the xdist scheduler sees only node ids)."""
    path = nodeid.split("::", 1)[0]
    return path.startswith("tests/integration/") and "vllm" in path.rpartition("/")[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def vllm_skipped() -> bool:
    return os.environ.get(SKIP_VLLM_ENV) == "1" and not _in_ci()


def wanted(markers: list[tuple[str, ...]]) -> list[str]:
    """The servers the collected tests' ``vllm`` markers name, in order, once each."""
    names: list[str] = []
    for args in markers:
        for name in args or DEFAULT_SERVERS:
            if name not in names:
                names.append(name)
    return names


class Fleet:
    """The session's vLLM servers, started one after the other in a thread,
    each awaited on first use."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.servers: dict[str, Vllm] = {}
        self.error: str | None = None
        self._queue: list[str] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._dirs: dict[str, Path] = {}
        #: The servers the session's tests name (``wanted``): the first ``ready``
        #: queues them all when the fleet was not launched at collection.
        self.wanted: list[str] = []

    def launch(self, names: Sequence[str] = DEFAULT_SERVERS, *, first: str | None = None) -> None:
        """Queue ``names`` (returns at once): each starts once the one before it
        serves (or failed; ``ready`` reports it); ``first``, if queued, starts
        next (a test waits for it). An install problem is kept and reported by
        ``ready``."""
        try:
            vllm_python()
            from shadow_proxy.devtools.tiny_llama import build_fleet

            self._dirs = self._dirs or build_fleet(MODELS_DIR)
        except VllmUnavailable as e:
            self.error = str(e)
            return
        with self._lock:
            self._queue = queued(self._queue, self.servers, names, first)
            if self._thread is None and self._queue:
                self._thread = threading.Thread(target=self._start_in_turn, daemon=True)
                self._thread.start()

    def _start_in_turn(self) -> None:
        while True:
            with self._lock:
                if self._stopped or not self._queue:
                    self._thread = None
                    return
                name = self._queue.pop(0)
                server = launch_vllm(
                    self._dirs[name],
                    name,
                    self.scratch / name,
                    aliases=("llama",) if name != "llama" else (),
                    **FLEET[name],
                )
                self.servers[name] = server
            with contextlib.suppress(VllmStartError):  # ready() says why
                asyncio.run(server.wait_ready(900.0))

    async def ready(self, name: str, timeout: float = 900.0) -> Vllm:
        """The server ``name``, once it serves (fails the test when vLLM is missing)."""
        if vllm_skipped():
            pytest.skip(f"{SKIP_VLLM_ENV}=1")
        if self.error is None and name not in self.servers:
            self.launch((name, *self.wanted), first=name)
        if self.error:
            hint = "" if _in_ci() else f" (or set {SKIP_VLLM_ENV}=1 to skip the vLLM tests)"
            pytest.fail(f"{self.error}{hint}", pytrace=False)
        await wait_until(lambda: name in self.servers, timeout, 0.5, what=f"vLLM {name} launched")
        return await self.servers[name].wait_ready(timeout)

    def stop(self) -> None:
        """Nothing more starts; every server started is stopped."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            servers = list(self.servers.values())
        for server in servers:
            server.stop()


async def all_ready(fleet: Fleet, *names: str) -> list[Vllm]:
    return list(await asyncio.gather(*(fleet.ready(n) for n in names)))
