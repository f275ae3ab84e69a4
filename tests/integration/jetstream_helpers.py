"""Helpers shared by the JetStream integration tests: proxy configs with JetStream
taps and the consumer's command line (the publisher fed without a proxy and the
stream's content: tests/support/jetstream.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from shadow_proxy.config import Config
from tests.support import ROOT
from tests.support.jetstream import MODEL, nats_section
from tests.support.servers import proxy_config

#: The two taps of the reference deployment (deploy/kubernetes/base/configmap.yaml).
REFERENCE_TAPS = (
    {"name": "kv", "topic": "kv", "capture": "request", "filters": ["tokens-only"]},
    {
        "name": "replay",
        "topic": "replay",
        "capture": "request_response",
        "emit": "joined",
        "filters": ["strip-multimodal"],
        "response": {"tokens": True},
    },
)


def jetstream_config(
    frontend: str, model_dirs: dict[str, Path], servers: list[str], *taps: dict, **nats: Any
) -> Config:
    models = [{"name": MODEL, "tokenizer": str(model_dirs[MODEL])}]
    return proxy_config(
        frontend,
        models=models,
        nats=nats_section(servers, **nats),
        taps=list(taps),
        shutdown_grace_s=1,
    )


def on_nats(tap: dict, suffix: str = "", **extra: Any) -> dict:
    """The tap published to JetStream (its name and topic with ``suffix``)."""
    return {
        **tap,
        "name": tap["name"] + suffix,
        "topic": tap["topic"] + suffix,
        "transport": "nats",
        **extra,
    }


async def consumer_cli(*args: str, timeout: float = 60.0) -> dict[str, Any]:
    """Run ``shadow-consumer`` to the end; its JSON summary."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shadow_proxy.cli",
        "--log-level",
        "warning",
        "consumer",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode == 0, err.decode()[-2000:]
    return json.loads(out)
