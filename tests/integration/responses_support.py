"""Shared by the Responses and batch integration tests: a record collector keyed
by ``(tap, request_id, prompt_index)`` and what a client saw of a Responses answer."""

from __future__ import annotations

import json
import threading
from typing import Any

import attrs
import zmq

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records import wire


class Collector:
    """A SUB socket on the taps, read by a thread; records by (tap, request id, prompt)."""

    def __init__(self, endpoints: list[str], topics: list[str]) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        for topic in topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        for endpoint in endpoints:
            self.socket.connect(endpoint)
        self.records: dict[tuple[str, str, int | None], dict] = {}
        self.count = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.stopping.is_set():
            if not poller.poll(50):
                continue
            while True:
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = wire.decode_frames(frames)
                if message.topic.endswith(wire.HEARTBEAT_SUFFIX):
                    continue
                envelope = wire.decode_envelope(message.payload)
                key = (envelope["tap"], envelope["request_id"], envelope.get("prompt_index"))
                with self.lock:
                    assert key not in self.records, f"two records for {key}"
                    self.records[key] = envelope
                    self.count += 1

    def get(self, tap: str, request_id: str, prompt_index: int | None = None) -> dict | None:
        with self.lock:
            return self.records.get((tap, request_id, prompt_index))

    def of_request(self, tap: str, request_id: str) -> list[dict]:
        """Every record of a request on a tap, by prompt index."""
        with self.lock:
            found = [r for (t, rid, _), r in self.records.items() if (t, rid) == (tap, request_id)]
        return sorted(found, key=lambda r: r.get("prompt_index", -1))

    async def wait(
        self, tap: str, keys: list[tuple[str, int | None]], timeout: float = 30
    ) -> dict[tuple[str, int | None], dict]:
        """The tap's records for ``(request_id, prompt_index)`` keys; fails naming the missing."""
        await wait_until(
            lambda: all(self.get(tap, *k) is not None for k in keys),
            timeout,
            0.02,
            what=f"{tap}: a record for each of {len(keys)} keys (first: {keys[:3]})",
        )
        return {k: self.get(tap, *k) for k in keys}

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close()
        self.context.term()


@attrs.frozen
class ResponsesView:
    """What a client saw of a Responses answer."""

    status: str | None  # the response status: completed, incomplete, failed (None: no end)
    reason: str | None  # incomplete_details.reason
    usage: dict[str, Any] | None
    response_id: str | None
    calls: bool  # function_call items in the output
    error: str | None

    @classmethod
    def parse(cls, data: bytes, stream: bool) -> ResponsesView:
        if stream:
            final = None
            response_id = None
            for line in data.decode("utf-8", "replace").splitlines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                response = event.get("response")
                if isinstance(response, dict):
                    response_id = response_id or response.get("id")
                    if event["type"] in ("response.completed", "response.incomplete",
                                         "response.failed"):  # fmt: skip
                        final = response
            if final is None:
                return cls(None, None, None, response_id, False, None)
        else:
            final = json.loads(data)
        details = final.get("incomplete_details") or {}
        error = final.get("error") or {}
        output = final.get("output") or []
        return cls(
            status=final.get("status"),
            reason=details.get("reason"),
            usage=final.get("usage"),
            response_id=final.get("id"),
            calls=any(item.get("type") == "function_call" for item in output),
            error=error.get("message"),
        )

    def expected(self) -> tuple[str, str | None]:
        """The record's outcome and finish reason for this view (responses_events.py)."""
        if self.status == "failed":
            return "error", None
        if self.status == "completed":
            return "complete", "tool_calls" if self.calls else "stop"
        if self.status == "incomplete":
            return "complete", {"max_output_tokens": "length"}.get(self.reason, self.reason)
        return "incomplete", None
