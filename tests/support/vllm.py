"""The rule for tests that need the real vLLM (marker ``vllm``) and the fleet
they share: three vLLM 0.32 servers started once per test session, in the
background as soon as the session has collected a ``vllm`` test (their 1-3
minutes of start-up overlap the tests that run before them), stopped at its end.

The fleet (``.models/`` dirs from ``devtools/tiny_llama.py``; every server also
answers to ``llama``, so that any of them is a replay candidate for records of
``llama``):

- ``llama``: the primary. Seed-0 weights, the DeepSeek-format template (openai
  content format), 1 GiB of KV cache (8,192 blocks of 128 tokens), tools on;
- ``llama-tools``: the same weights under the Hermes tool template (string
  content format), 192 blocks of KV cache (191 usable), tools on. Same weights
  as ``llama``: the A/A replay's twin, and the small cache of the KV test;
- ``llama-other``: seed-1 weights, the changed candidate.

A test takes a server with ``await vllm_fleet.ready(name)``. Another test module
that needs another server (a perturbed-weights candidate: ``llama-noisy``)
adds it to ``FLEET``: it starts with the others.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools.vllm import Vllm, VllmUnavailable, launch_vllm, vllm_python
from tests.support import MODELS_DIR

#: Set to 1 to skip the tests that need vLLM (developers without it); ignored under CI.
SKIP_VLLM_ENV = "SHADOW_PROXY_SKIP_VLLM"

FLEET: dict[str, dict[str, Any]] = {
    "llama": {"kv_cache_gib": 1, "tools": True},
    "llama-tools": {"num_blocks": 192, "tools": True},
    # Prompt-token details: the closed-loop replay reports the cached share per turn.
    "llama-other": {"extra_args": ("--enable-prompt-tokens-details",)},
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def vllm_skipped() -> bool:
    return os.environ.get(SKIP_VLLM_ENV) == "1" and not _in_ci()


class Fleet:
    """The session's vLLM servers, launched together, each awaited on first use."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.servers: dict[str, Vllm] = {}
        self.error: str | None = None

    def launch(self) -> None:
        """Start every server of ``FLEET`` (returns at once); an install problem
        is kept and reported by ``ready``."""
        try:
            vllm_python()
            from shadow_proxy.devtools.tiny_llama import build_fleet

            dirs = build_fleet(MODELS_DIR)
            for name, options in FLEET.items():
                self.servers[name] = launch_vllm(
                    dirs[name],
                    name,
                    self.scratch / name,
                    aliases=("llama",) if name != "llama" else (),
                    **options,
                )
        except VllmUnavailable as e:
            self.error = str(e)

    async def ready(self, name: str, timeout: float = 900.0) -> Vllm:
        """The server ``name``, once it serves (fails the test when vLLM is missing)."""
        if vllm_skipped():
            pytest.skip(f"{SKIP_VLLM_ENV}=1")
        if self.error:
            hint = "" if _in_ci() else f" (or set {SKIP_VLLM_ENV}=1 to skip the vLLM tests)"
            pytest.fail(f"{self.error}{hint}", pytrace=False)
        return await self.servers[name].wait_ready(timeout)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


async def all_ready(fleet: Fleet, *names: str) -> list[Vllm]:
    return list(await asyncio.gather(*(fleet.ready(n) for n in names)))
