"""Capture helper for the replay tests: the proxy (run as the tests run it) in
front of an upstream, one joined tap, ``shadow-consumer --record`` in a thread
writing a rotated record set. No pytest fixtures here: test modules call it."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from shadow_proxy.consumer.main import run_consumer
from shadow_proxy.devtools.processes import reserve_port, wait_until
from shadow_proxy.records import files, sources
from shadow_proxy.records.wire import decode_envelope
from shadow_proxy.replay.cli import deliveries_of
from tests.support.servers import proxy_config, run_proxy


class Consumer:
    """``shadow-consumer --record`` in a thread, until ``close``."""

    def __init__(self, endpoint: str, topic: str, out: Path, max_bytes: int) -> None:
        self.summary = out / "consumer-summary.json"
        self.stop = threading.Event()
        self.records = out / "records"
        self.records.mkdir()
        argv = [
            "--endpoint",
            endpoint,
            "--topic",
            topic,
            "--interval",
            "0.1",
            "--summary-path",
            str(self.summary),
            "--record",
            str(self.records / "joined.rec"),
            "--record-max-bytes",
            str(max_bytes),
            "--record-keep",
            "1000",
        ]
        self.sink = sink = open(os.devnull, "w")  # noqa: SIM115
        self.thread = threading.Thread(
            target=run_consumer, args=(argv,), kwargs={"stop": self.stop, "out": sink, "err": sink}
        )
        self.thread.start()

    def read(self) -> dict:
        try:
            return json.loads(self.summary.read_text())
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sink.close()


async def capture(
    upstream: str,
    models: Sequence[dict[str, Any]],
    requests: Sequence[tuple[str, dict[str, Any]]],
    out: Path,
    *,
    max_bytes: int = 1 << 30,
    gap_s: float = 0.01,
    worker: dict[str, Any] | None = None,
) -> Path:
    """Send ``(request_id, chat body)`` pairs through a proxy in front of
    ``upstream`` one at a time; returns the directory of the record set once
    the consumer has every joined record. ``worker``: the tap worker's
    settings (default: the tests' priority, ``servers.TEST_WORKER``)."""
    endpoint = f"tcp://127.0.0.1:{reserve_port()}"
    taps = [
        {
            "name": "joined",
            "topic": "joined",
            "capture": "request_response",
            "emit": "joined",
            "endpoint": endpoint,
            "capacity": 4096,
        },
    ]
    config = proxy_config(upstream, models=list(models), taps=taps, worker=worker or {})
    consumer = Consumer(endpoint, "joined", out, max_bytes)
    try:
        async with run_proxy(config) as (url, _registry, _app):
            await wait_until(lambda: consumer.read().get("heartbeats", 0) >= 1, timeout=15)
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for request_id, body in requests:
                    async with session.post(
                        f"{url}/v1/chat/completions",
                        json=body,
                        headers={"x-request-id": request_id},
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        await resp.read()
                    await asyncio.sleep(gap_s)
            await wait_until(lambda: consumer.read().get("records") == len(requests), timeout=30)
    finally:
        consumer.close()
    return consumer.records


def load_records(directory: Path) -> list[dict[str, Any]]:
    """Every envelope of a record set, in file order (publish order)."""
    return [decode_envelope(p) for f in files.expand([directory]) for p in files.read_payloads(f)]


def file_records(source: Path):
    """What the replay reads from a record set: (envelopes, unreadable counts)."""
    record_source = sources.FileSource(files.expand([source]))
    return deliveries_of(record_source), lambda: record_source.stats.unreadable
