"""``POST /v1/responses`` on the built-in frontend, in this process: the events
as Dynamo 1.6.1 frames them, the unary object, usage, and what it refuses."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.support.frontend import Server, stats_of

INPUT = {"model": "deepseek", "input": "Tell me about shadows.", "max_output_tokens": 4}


def events(body: bytes) -> list[tuple[str, dict]]:
    """(event type, data) of an SSE body, ``[DONE]`` left out."""
    found = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "data" in lines and lines["data"] != "[DONE]":
            found.append((lines.get("event", ""), json.loads(lines["data"])))
    return found


@pytest.fixture
async def url(start: Callable[..., Awaitable[Server]]) -> str:
    return (await start())[0]


class TestStream:
    """Created, in progress, one message item, one delta per token, then the end."""

    async def test_incomplete_at_max_output_tokens(
        self, url: str, http: aiohttp.ClientSession
    ) -> None:
        async with http.post(url + "/v1/responses", json={**INPUT, "stream": True}) as resp:
            assert resp.status == 200
            body = await resp.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        found = events(body)
        kinds = [kind for kind, _ in found]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds.count("response.output_text.delta") == 4
        assert kinds[-1] == "response.incomplete"
        numbers = [data["sequence_number"] for _, data in found]
        assert numbers == sorted(numbers)
        final = found[-1][1]["response"]
        assert final["usage"]["output_tokens"] == 4 and final["usage"]["input_tokens"] > 0

    async def test_stop_after_completes(self, url: str, http: aiohttp.ClientSession) -> None:
        body = {**INPUT, "stream": True}
        headers = {"x-mock-fault": "stop-after=2"}
        async with http.post(url + "/v1/responses", json=body, headers=headers) as resp:
            found = events(await resp.read())
        assert found[-1][0] == "response.completed"
        assert [k for k, _ in found].count("response.output_text.delta") == 2


class TestUnary:
    """The unary answer is the final response object, usage included."""

    async def test_object(self, url: str, http: aiohttp.ClientSession) -> None:
        async with http.post(url + "/v1/responses", json=INPUT) as resp:
            assert resp.status == 200
            reply = await resp.json()
        assert reply["status"] == "incomplete" and reply["id"].startswith("resp_")
        assert reply["usage"]["output_tokens"] == 4
        [message] = reply["output"]
        assert message["content"][0]["text"]


class TestRefused:
    """What Dynamo 1.6.1 does not implement is a 501; an unknown model a 404."""

    @pytest.mark.parametrize(
        ("extra", "status"),
        [
            ({"previous_response_id": "resp_1"}, 501),
            ({"background": True}, 501),
            ({"model": "nope"}, 404),
        ],
    )
    async def test_refused(
        self, start: Callable[..., Awaitable[Server]], extra: dict, status: int
    ) -> None:
        server = await start()
        async with aiohttp.ClientSession() as session:
            async with session.post(server[0] + "/v1/responses", json={**INPUT, **extra}) as r:
                assert r.status == status
        assert stats_of(server)["rejected"] == 1
