"""The scorer against small engines on loopback: one that returns vLLM's
prompt_logprobs, one that ignores the field as Dynamo 1.6.1 does; and a whole
replay with ``--score`` (report section, score.png, summary ``score``)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shadow_proxy.replay.logprobs import ScoringError
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.replay.scorer import Scorer, ScoreUnsupported, is_greedy, output_ids
from tests.support.replay import joined_record
from tests.support.servers import serve
from tests.unit.replay.test_client import vllm_like


def answer(prompt: list[int], shift: float = 0.0, *, scores: bool = True) -> dict[str, Any]:
    """A scoring answer: every token at probability 0.5 (its top-1), token 0 at
    0.25 - ``shift``; without ``scores`` the field is left out (Dynamo)."""
    entries: list[Any] = [None]
    for token in prompt[1:]:
        other = 0 if token != 0 else 1
        entries.append(
            {
                str(token): {"logprob": math.log(0.5), "rank": 1, "decoded_token": f"<{token}>"},
                str(other): {"logprob": math.log(0.25 - shift), "rank": 2, "decoded_token": "o"},
            }
        )
    choice: dict[str, Any] = {"index": 0, "text": "x", "finish_reason": "length"}
    if scores:
        choice["prompt_logprobs"] = entries
    return {"choices": [choice]}


def engine(shift: float = 0.0, *, scores: bool = True) -> web.Application:
    """Answers scoring requests (``answer``), and other requests as vLLM would."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "prompt_logprobs" not in body:
            return await vllm_like(request)
        return web.json_response(answer(body["prompt"], shift, scores=scores))

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


async def models(_: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "deepseek"}]})


async def bad_request(_: web.Request) -> web.Response:
    return web.json_response({}, status=400)


def scorer(url: str) -> Scorer:
    return Scorer(
        url, target="candidate", top_k=2, concurrency=2, connect_timeout_s=2, read_timeout_s=5
    )


class TestScorer:
    async def test_scores(self) -> None:
        async with serve(engine()) as url:
            s = scorer(url)
            try:
                await s.probe("deepseek")
                got = await s.score("deepseek", [1, 2], [3, 4, 5])
            finally:
                await s.close()
        assert len(got) == 3 and got.top1.all() and got.texts == ("<3>", "<4>", "<5>")

    async def test_engine_without_prompt_logprobs(self) -> None:
        async with serve(engine(scores=False)) as url:
            s = scorer(url)
            try:
                with pytest.raises(ScoreUnsupported, match="does not return prompt log-prob"):
                    await s.probe("deepseek")
            finally:
                await s.close()

    async def test_an_answer_in_pieces(self) -> None:
        """vLLM under load sends a long answer in several pieces: all are read (one
        read returned the first piece alone: 'an answer that is not JSON')."""

        async def in_pieces(request: web.Request) -> web.StreamResponse:
            body = json.dumps(answer((await request.json())["prompt"])).encode()
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(body)
            await resp.prepare(request)
            for start in range(0, len(body), 7):
                await resp.write(body[start : start + 7])
                await asyncio.sleep(0.001)  # each piece on its own
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", in_pieces)
        async with serve(app) as url:
            s = scorer(url)
            try:
                got = await s.score("deepseek", [1, 2], [3, 4, 5])
            finally:
                await s.close()
        assert len(got) == 3 and got.texts == ("<3>", "<4>", "<5>")

    async def test_error_status(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", bad_request)
        async with serve(app) as url:
            s = scorer(url)
            try:
                with pytest.raises(ScoringError, match="HTTP 400"):
                    await s.score("m", [1], [2])
            finally:
                await s.close()

    def test_record_fields(self) -> None:
        record = joined_record(1, "ab", max_tokens=2)
        assert output_ids(record) is None
        record["response"]["choices"][0]["token_ids"] = [7, 8]
        assert output_ids(record) == [7, 8]
        assert is_greedy({"temperature": 0}) and not is_greedy({"temperature": 0.7})


async def records(n: int) -> AsyncIterator[dict[str, Any]]:
    for seq in range(n):
        record = joined_record(seq, "t0t1t2", max_tokens=6)
        record["request"]["sampling_options"] = {"temperature": 0}
        record["response"]["choices"][0]["token_ids"] = [10, 11, 12, 13, 14, 15]
        yield record


class TestReplayWithScore:
    """``--score`` on a run: the summary's ``score``, the report's section, score.png."""

    async def _run(self, tmp_path: Path, shift: float, n: int = 12) -> dict[str, Any]:
        async with serve(engine(shift)) as cand, serve(engine()) as base:
            options = ReplayOptions(
                candidate=cand,
                baseline=base,
                out_dir=tmp_path,
                speed=None,
                score=True,
                score_top_k=2,
            )
            replay = Replay(options, "shadow-replay records --score")
            await replay.check_targets()
            return await replay.run(records(n))

    async def test_same_engine(self, tmp_path: Path) -> None:
        summary = await self._run(tmp_path, 0.0)
        score = summary["score"]
        assert score["records"] == 12 and score["verdict"] == "no difference", score
        assert score["greedy_records"] == 12 and score["mcnemar_p"] == 1.0
        report = (tmp_path / "report.md").read_text()
        assert "## Scores" in report and "![score.png](score.png)" in report
        assert (tmp_path / "score.png").stat().st_size > 10_000
        line = json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])
        assert line["score"]["positions"] == 6

    async def test_shifted_candidate_is_worse(self, tmp_path: Path) -> None:
        score = (await self._run(tmp_path, 0.1))["score"]
        assert score["verdict"] == "worse" and "KL" in score["reason"], score
        assert score["kl_mean"]["candidate"] > 0 == score["kl_mean"]["baseline"]

    async def test_few_records(self, tmp_path: Path) -> None:
        score = (await self._run(tmp_path, 0.1, n=3))["score"]
        assert score["verdict"] == "no verdict" and "only 3 records" in score["reason"]

    def test_needs_a_baseline(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="needs '--baseline'"):
            Replay(ReplayOptions(candidate="http://x", out_dir=tmp_path, score=True), "c")
