"""Helpers of the tap worker's integration tests: its processes, a consumer, frontends."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import zmq
from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_proxy.consumer.accounting import Accounts
from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.records import wire

#: Worker start-up (spawn, import transformers, load tokenizers in each shard).
START_S = 90.0


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def shard_pids(main_pid: int) -> list[int]:
    """The worker main's shard processes."""
    pids = []
    for pid in children(main_pid):
        try:
            if b"shadow_proxy.worker.shard" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` value in kB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def tap(name: str, capture: str = "request", **extra: Any) -> dict[str, Any]:
    return {"name": name, "capture": capture, "endpoint": reserve_endpoint(), **extra}


def chat(content: str, model: str = "deepseek", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": 4,
        **extra,
    }


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def tap_counters(registry: CollectorRegistry) -> dict[tuple, float]:
    """Every sample of the shadow_tap_* counters (to check none goes backwards)."""
    found = {}
    for family in registry.collect():
        if family.name.startswith("shadow_tap_") and family.type == "counter":
            for s in family.samples:
                if s.name.endswith("_total"):
                    found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


#: Consumers of the running test, closed by ``close_consumers``.
OPEN: list[Consumer] = []


def close_consumers() -> None:
    while OPEN:
        OPEN.pop().close()


class Consumer:
    """A SUB socket on one tap, every message accounted for as shadow-consumer does."""

    def __init__(self, context: zmq.Context, endpoint: str, topic: str):
        self.topic = topic
        self.socket = context.socket(zmq.SUB)
        OPEN.append(self)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.connect(endpoint)
        self.socket.subscribe(topic.encode())
        self.accounts = Accounts(topic, grace=0.0)
        self.records: list[dict] = []
        self.messages: list[wire.Message] = []
        self.heartbeats: list[tuple[wire.Message, wire.Heartbeat]] = []

    def poll(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.accounts.on_frames(frames, time.monotonic())
            message = wire.decode_frames(frames)
            if message.topic == self.topic:
                self.messages.append(message)
                self.records.append(wire.decode_envelope(message.payload))
            else:
                self.heartbeats.append((message, wire.Heartbeat.decode(message.payload)))

    def has(self, n: int) -> bool:
        self.poll()
        return len(self.records) >= n

    def got_heartbeat(self) -> bool:
        self.poll()
        return bool(self.heartbeats)

    def summary(self) -> dict[str, Any]:
        self.poll()
        return self.accounts.summary(time.monotonic() + 1)

    def close(self) -> None:
        self.socket.close(linger=0)


# -- a frontend that does nothing but answer ------------------------------------------

SSE = (
    b'data: {"id":"r","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    b'data: {"id":"r","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
HANG_HEADER = "x-test-hang"
BOMB_HEADER = "x-test-gzip-bomb"


def plain_frontend(bomb: bytes = b"") -> web.Application:
    """Reads the body, answers a short SSE stream; ``x-test-hang``: headers, then
    nothing until the client goes away; ``x-test-gzip-bomb``: ``bomb``, gzip-encoded."""

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        headers = {"Content-Type": "text/event-stream"}
        if request.headers.get(BOMB_HEADER):
            headers["Content-Encoding"] = "gzip"
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        if request.headers.get(HANG_HEADER):
            await asyncio.sleep(3600)
        if request.headers.get(BOMB_HEADER):
            for start in range(0, len(bomb), 64 * 1024):
                await response.write(bomb[start : start + 64 * 1024])
        else:
            await response.write(SSE)
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


def is_idle(tid_path: Path) -> bool:
    return os.sched_getscheduler(int(tid_path.name)) == os.SCHED_IDLE
