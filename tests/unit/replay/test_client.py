"""The candidate client against real servers on loopback: the built-in frontend
(with its latency settings and faults) and a small vLLM-style server that returns
token ids; failures end as observations, never as exceptions."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from shadow_proxy.devtools.processes import reserve_port
from shadow_proxy.replay.client import CandidateClient, TargetUnavailable, check_url
from shadow_proxy.replay.request import ORIGINAL_REQUEST_ID_HEADER, CandidateRequest
from shadow_proxy.replay.runner import load_tokenizer
from tests.support.servers import serve

pytestmark = pytest.mark.timeout(60)


def request(prompt_len: int = 5, max_tokens: int = 6, **extra) -> CandidateRequest:
    body = {
        "model": "deepseek",
        "prompt": list(range(1, prompt_len + 1)),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    return CandidateRequest("rid-7", body, prompt_len)


class TestStream:
    """A streamed answer: timings, text, finish reason, usage."""

    async def test_measures_the_built_in_frontend(self, frontend: str, loaded: dict) -> None:
        async with CandidateClient(frontend, concurrency=2) as client:
            obs = await client.send(request(max_tokens=6, n=2))
        assert obs.outcome == "complete" and obs.error is None and obs.http_status == 200
        assert obs.finish_reasons == ("length", "length")
        assert obs.texts == (loaded["deepseek"].output_text(6),) * 2
        assert obs.prompt_tokens == 5 and obs.output_tokens == 12
        assert obs.choice_tokens == (6, 6)  # chunks per choice, usage is the total
        assert 80 <= obs.ttft_ms < 400
        assert 20 <= obs.itl_ms < 100
        assert obs.e2e_ms >= obs.ttft_ms + 5 * 20
        assert obs.token_ids is None

    async def test_tokenizer_gives_ids(self, frontend: str, model_dirs: dict) -> None:
        tokenizer = load_tokenizer(model_dirs["deepseek"])
        async with CandidateClient(frontend, concurrency=1, tokenizer=tokenizer) as client:
            obs = await client.send(request(max_tokens=20))
        assert obs.texts is not None and obs.token_ids is not None
        expected = tokenizer.encode(obs.texts[0], add_special_tokens=False).ids
        assert obs.token_ids == (tuple(expected),)
        assert obs.choice_tokens == (20,)  # usage, one choice


class TestFailures:
    """Every failure is an observation with a status and a message."""

    @pytest.mark.parametrize(
        ("fault", "status", "message"),
        [
            ("status=503", 503, "mock fault: status 503"),
            ("error-event-after=2", 200, "worker died"),
        ],
    )
    async def test_error_answers(self, frontend: str, fault: str, status: int, message: str):
        async with CandidateClient(frontend, concurrency=1) as client:
            obs = await client.send(request(mock_fault=fault))
        assert (obs.outcome, obs.http_status, obs.error) == ("error", status, message)
        assert obs.error_key == ("503" if status == 503 else "stream")

    async def test_dropped_connection(self, frontend: str) -> None:
        async with CandidateClient(frontend, concurrency=1) as client:
            obs = await client.send(request(mock_fault="drop-after=2"))
        assert obs.outcome == "error" and obs.http_status == 200
        assert obs.error and "Payload" in obs.error
        assert obs.error_kind == "stream"  # the answer began, then broke

    async def test_unreachable(self) -> None:
        url = f"http://127.0.0.1:{reserve_port()}"
        async with CandidateClient(url, concurrency=1) as client:
            obs = await client.send(request())
        assert obs.outcome == "error" and obs.http_status is None
        assert obs.error and "Connect" in obs.error
        assert obs.error_key == "connection"

    async def test_read_timeout(self, frontend: str) -> None:
        """A read timeout is a ``timeout``, not a ``connection`` failure."""
        async with CandidateClient(frontend, concurrency=1, read_timeout_s=0.3) as client:
            obs = await client.send(request(mock_fault="hang"))
        assert obs.outcome == "error" and obs.error and "Timeout" in obs.error
        assert obs.error_key == "timeout"

    async def test_unfinished_choice_is_incomplete(self, frontend: str) -> None:
        async with CandidateClient(frontend, concurrency=1) as client:
            obs = await client.send(request(n=2, mock_fault="unfinished-choice=1"))
        assert obs.outcome == "incomplete" and obs.finish_reasons == ("length", None)


async def vllm_like(request_: web.Request) -> web.StreamResponse:
    """Streams token ids on each choice (vLLM's return_token_ids), two ids a chunk."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request_)
    for k in range(3):
        choice = {"index": 0, "text": f"t{k}", "token_ids": [10 + 2 * k, 11 + 2 * k]}
        choice["finish_reason"] = "stop" if k == 2 else None
        await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
    usage = {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


class TestReturnedIds:
    """Token ids on the choices are taken as they are, before any tokenizer."""

    async def test_ids(self, model_dirs: dict) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", vllm_like)
        async with serve(app) as url:
            tokenizer = load_tokenizer(model_dirs["deepseek"])
            async with CandidateClient(url, concurrency=1, tokenizer=tokenizer) as client:
                obs = await client.send(request())
        assert obs.token_ids == ((10, 11, 12, 13, 14, 15),)
        assert obs.texts == ("t0t1t2",)
        assert obs.output_tokens == 6 and obs.outcome == "complete"


class TestRequestIds:
    """Each target sends its own request id; the record's own id travels beside it."""

    async def test_headers(self) -> None:
        seen: list[dict[str, str]] = []

        async def keep(request_: web.Request) -> web.StreamResponse:
            seen.append({k.lower(): v for k, v in request_.headers.items()})
            return await vllm_like(request_)

        app = web.Application()
        app.router.add_post("/v1/completions", keep)
        async with serve(app) as url:
            for target in ("candidate", "baseline"):
                async with CandidateClient(url, concurrency=1, target=target) as client:
                    await client.send(request())
        assert [h["x-request-id"] for h in seen] == ["rid-7-candidate", "rid-7-baseline"]
        assert all(h[ORIGINAL_REQUEST_ID_HEADER] == "rid-7" for h in seen)
        assert all("x-dynamo-request-id" not in h for h in seen)


class TestCheck:
    """Before a replay a target must answer ``GET /v1/models`` (and serve ``--model``)."""

    async def test_lists_the_models(self, frontend: str) -> None:
        async with CandidateClient(frontend, concurrency=1) as client:
            assert "deepseek" in await client.check()
            assert "deepseek" in await client.check("deepseek")
            with pytest.raises(TargetUnavailable, match="does not serve model 'other'"):
                await client.check("other")

    async def test_nothing_listening(self) -> None:
        url = f"http://127.0.0.1:{reserve_port()}"
        async with CandidateClient(url, concurrency=1, target="baseline") as client:
            with pytest.raises(TargetUnavailable, match=r"^baseline http://.* does not answer GET"):
                await client.check()

    async def test_error_status(self) -> None:
        async def broken(_request: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "down"}}, status=500)

        app = web.Application()
        app.router.add_get("/v1/models", broken)
        async with serve(app) as url, CandidateClient(url, concurrency=1) as client:
            with pytest.raises(TargetUnavailable, match="with HTTP 500: down"):
                await client.check()

    def test_url_needs_a_scheme(self) -> None:
        assert check_url("http://h:1", "--candidate") == "http://h:1"
        with pytest.raises(ValueError, match=r"'--candidate' must be an http:// or https:// URL"):
            check_url("127.0.0.1:8000", "--candidate")
