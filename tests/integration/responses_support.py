"""Shared by the Responses and batch integration tests: records of several taps
keyed by ``(tap, request_id, prompt_index)`` (read with the shared test
subscriber) and what a client saw of a Responses answer."""

from __future__ import annotations

import json
from typing import Any

import attrs

from shadow_proxy.devtools.processes import wait_until
from tests.support.subscriber import TapSubscriber


class Collector:
    """Several taps' records by ``(tap, request id, prompt index)``: each tap (its
    endpoint and topic) is read by the shared test subscriber."""

    def __init__(self, endpoints: list[str], topics: list[str]) -> None:
        self.subscribers = [
            TapSubscriber(endpoint, topic)
            for endpoint, topic in zip(endpoints, topics, strict=True)
        ]

    def records(self) -> dict[tuple[str, str, int | None], dict]:
        """Every record so far by key; fails if a key has two records."""
        out: dict[tuple[str, str, int | None], dict] = {}
        for subscriber in self.subscribers:
            for envelope in subscriber.received().records:
                key = (envelope["tap"], envelope["request_id"], envelope.get("prompt_index"))
                assert key not in out, f"two records for {key}"
                out[key] = envelope
        return out

    def get(self, tap: str, request_id: str, prompt_index: int | None = None) -> dict | None:
        return self.records().get((tap, request_id, prompt_index))

    def of_request(self, tap: str, request_id: str) -> list[dict]:
        """Every record of a request on a tap, by prompt index."""
        found = [r for (t, rid, _), r in self.records().items() if (t, rid) == (tap, request_id)]
        return sorted(found, key=lambda r: r.get("prompt_index", -1))

    async def wait(
        self, tap: str, keys: list[tuple[str, int | None]], timeout: float = 30
    ) -> dict[tuple[str, int | None], dict]:
        """The tap's records for ``(request_id, prompt_index)`` keys; fails naming the missing."""

        def missing() -> list[tuple[str, int | None]]:
            records = self.records()
            return [k for k in keys if (tap, *k) not in records]

        await wait_until(
            lambda: not missing(),
            timeout,
            0.02,
            what=f"{tap}: a record for each of {len(keys)} keys (missing: {missing()[:3]})",
        )
        records = self.records()
        return {k: records[(tap, *k)] for k in keys}

    def close(self) -> None:
        for subscriber in self.subscribers:
            subscriber.close()


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
                    if event["type"] in (
                        "response.completed",
                        "response.incomplete",
                        "response.failed",
                    ):
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
