"""Asks one deployment for teacher-forced log-probabilities (``--score``).

``Scorer.probe`` runs once before the replay, for each target: one scoring
request on a two-token prompt must come back with ``prompt_logprobs``, else
``ScoreUnsupported`` (a ``client.TargetUnavailable``: the command line prints
its one line and exits 2). Dynamo 1.6.1 answers such a request 200 and leaves
the field out; vLLM 0.32 returns it. ``Scorer.score`` runs once per record
(twice on the baseline) and returns the ``logprobs.Scoring``, or raises
``logprobs.ScoringError`` saying why there is none (an error status, a
connection that failed, an answer without the scores).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from shadow_proxy.replay.client import TargetUnavailable
from shadow_proxy.replay.logprobs import Scoring, ScoringError, score_body
from shadow_proxy.replay.request import COMPLETIONS_PATH, CandidateRequest
from shadow_proxy.replay.scores import ScoreTally

#: An answer larger than this is not a scoring (32 MiB: 4,096 positions of top 10).
MAX_BODY_BYTES = 32 << 20
_PROBE_IDS = (1, 2)


class ScoreUnsupported(TargetUnavailable):
    """A target that does not return prompt log-probabilities."""


class Scorer:
    """Scores recorded outputs on the deployment at ``base_url`` (without ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        target: str,
        top_k: int,
        concurrency: int,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        self.url = base_url.rstrip("/") + COMPLETIONS_PATH
        self.target = target
        self.top_k = top_k
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=connect_timeout_s, sock_read=read_timeout_s
            ),
        )

    async def close(self) -> None:
        await self._session.close()

    async def probe(self, model: str) -> None:
        """``ScoreUnsupported`` unless a scoring request comes back with its scores."""
        try:
            await self.score(model, _PROBE_IDS[:1], _PROBE_IDS[1:])
        except ScoringError as exc:
            msg = (
                f"--score: the {self.target} at {self.url} does not return prompt "
                f"log-probabilities ({exc}); vLLM does, Dynamo 1.6.1 ignores prompt_logprobs"
            )
            raise ScoreUnsupported(msg) from None

    async def score(
        self, model: str, prompt_ids: Sequence[int], output_ids: Sequence[int]
    ) -> Scoring:
        """The log-probabilities of ``output_ids`` after ``prompt_ids``."""
        body = score_body(model, prompt_ids, output_ids, self.top_k)
        try:
            async with self._session.post(self.url, json=body) as resp:
                data = await _read_bounded(resp.content, MAX_BODY_BYTES + 1)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            msg = f"{type(exc).__name__}: {exc}"
            raise ScoringError(msg) from None
        if status != 200:
            msg = f"HTTP {status}"
            raise ScoringError(msg)
        if len(data) > MAX_BODY_BYTES:
            msg = f"an answer over {MAX_BODY_BYTES} bytes"
            raise ScoringError(msg)
        try:
            answer = json.loads(data)
        except ValueError:
            msg = "an answer that is not JSON"
            raise ScoringError(msg) from None
        return Scoring.from_response(answer, output_ids)


async def _read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body to its end, or its first ``limit`` bytes (``read(n)`` alone returns
    whatever has arrived: part of an answer that comes in several pieces)."""
    data = bytearray()
    while len(data) < limit:
        piece = await content.read(limit - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


def output_ids(envelope: Mapping[str, Any]) -> list[int] | None:
    """The primary's recorded output ids (choice 0), None without any."""
    choices = (envelope.get("response") or {}).get("choices") or ()
    first = min(
        (c for c in choices if isinstance(c, Mapping)),
        key=lambda c: c.get("index", 0),
        default=None,
    )
    ids = None if first is None else first.get("token_ids")
    return list(ids) if isinstance(ids, list) and ids else None


def is_greedy(body: Mapping[str, Any]) -> bool:
    """The request decodes greedily (temperature 0, or top_k 1)."""
    return body.get("temperature") == 0 or body.get("top_k") == 1


async def score_record(
    candidate: Scorer,
    baseline: Scorer,
    tally: ScoreTally,
    envelope: Mapping[str, Any],
    request: CandidateRequest,
    exact: tuple[bool | None, bool | None],
    lengths: tuple[int | None, int | None],
) -> dict[str, Any] | None:
    """Score one replayed record on the candidate once and the baseline twice
    (at the same moment) and add it to ``tally``; returns the pair line's
    ``score`` entry (None: the record has no output ids to score)."""
    ids = output_ids(envelope)
    if ids is None:
        tally.failed("no_output_ids")
        return None
    model, prompt = str(request.body["model"]), list(request.body["prompt"])
    results = await asyncio.gather(
        candidate.score(model, prompt, ids),
        baseline.score(model, prompt, ids),
        baseline.score(model, prompt, ids),
        return_exceptions=True,
    )
    errors = {}
    for target, result in zip(("candidate", "baseline", "baseline"), results, strict=True):
        if isinstance(result, ScoringError):
            errors[target] = str(result)
        elif isinstance(result, BaseException):
            raise result
    if errors:
        for target in errors:
            tally.failed(target)
        return {"error": errors}
    c, b, again = (r for r in results if isinstance(r, Scoring))
    retokenized = (envelope.get("response") or {}).get("token_ids_source") == "retokenized"
    greedy = is_greedy(request.body)
    tally.add(c, b, again, greedy=greedy, exact=exact, lengths=lengths, retokenized=retokenized)
    return {
        "positions": len(c),
        "nll_mean": {"candidate": float(-c.logprobs.mean()), "baseline": float(-b.logprobs.mean())},
        "top1_agreement": {"candidate": float(c.top1.mean()), "baseline": float(b.top1.mean())},
    }
