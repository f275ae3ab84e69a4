"""A batch completions answer cut per prompt: prompt i gets the frontend's choices
i*n .. i*n+n-1, renumbered from 0, with its own outcome; what only the whole
answer shows stays whole in every prompt's share."""

from __future__ import annotations

import json

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.batch import for_prompt
from shadow_proxy.worker.response.observed import FinalResponse
from tests.support.responses import JSON, comp, encode, observe, sse


def final(*chunks: bytes, n: int, **kwargs) -> FinalResponse:
    return observe(*chunks, route=Route.COMPLETIONS, n=n, **kwargs).finalize(encode)


def unary(choices: list[dict], usage: dict | None = None) -> bytes:
    body: dict = {"id": "cmpl-b", "object": "text_completion", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode()


class TestChoices:
    """Each prompt keeps its own choices, renumbered from 0, with their tokens."""

    def test_two_prompts_two_choices_each(self) -> None:
        choices = [
            {"index": i, "text": text, "finish_reason": "stop"}
            for i, text in enumerate(["a", "bb", "ccc", "dddd"])
        ]
        answer = final(unary(choices), n=4, ctype=JSON)
        first, second = for_prompt(answer, 0, 2), for_prompt(answer, 1, 2)
        assert [(c.index, c.text) for c in first.observed.choices] == [(0, "a"), (1, "bb")]
        assert [(c.index, c.text) for c in second.observed.choices] == [(0, "ccc"), (1, "dddd")]
        assert second.token_ids == (encode("ccc"), encode("dddd"))
        assert second.output_tokens == (3, 4)
        assert first.observed.n == second.observed.n == 2

    def test_stream_with_interleaved_indices(self) -> None:
        body = sse(
            comp("x", index=1),
            comp("y", index=0),
            comp("z", index=1, finish="stop"),
            comp("", index=0, finish="length"),
        )
        answer = final(body, n=2)
        assert [c.text for c in for_prompt(answer, 0, 1).observed.choices] == ["y"]
        assert [c.text for c in for_prompt(answer, 1, 1).observed.choices] == ["xz"]
        assert for_prompt(answer, 1, 1).observed.choices[0].index == 0

    def test_whole_answer_fields_stay_whole(self) -> None:
        usage = {"prompt_tokens": 6, "completion_tokens": 3}
        choices = [
            {"index": 0, "text": "ab", "finish_reason": "stop"},
            {"index": 1, "text": "c", "finish_reason": "stop"},
        ]
        answer = final(unary(choices, usage), n=2, ctype=JSON)
        share = for_prompt(answer, 1, 1)
        assert share.observed.usage == usage
        assert share.observed.upstream_id == "cmpl-b"
        assert share.observed.http_status == 200
        assert share.observed.end_offset_ns == answer.observed.end_offset_ns
        # usage apportioned over the batch once: the shares add up to it
        assert for_prompt(answer, 0, 1).output_tokens + share.output_tokens == (2, 1)


class TestOutcome:
    """Each prompt's outcome is decided over its own choices, and the exchange's
    own errors hold for every prompt."""

    def test_one_prompt_unfinished(self) -> None:
        body = sse(comp("a", index=0, finish="stop"), comp("b", index=1), done=False)
        answer = final(body, n=2, end=EndKind.CLEAN)
        assert answer.observed.outcome == "incomplete"
        assert for_prompt(answer, 0, 1).observed.outcome == "complete"
        assert for_prompt(answer, 1, 1).observed.outcome == "incomplete"

    def test_error_finish_reason_is_that_prompts_only(self) -> None:
        body = sse(comp("a", index=0, finish="stop"), comp("b", index=1, finish="error"))
        answer = final(body, n=2)
        assert answer.observed.outcome == "error"
        assert for_prompt(answer, 0, 1).observed.outcome == "complete"
        assert for_prompt(answer, 1, 1).observed.outcome == "error"

    def test_broken_exchange_is_every_prompts(self) -> None:
        body = sse(comp("a", index=0, finish="stop"), comp("b", index=1), done=False)
        answer = final(body, n=2, end=EndKind.UPSTREAM_BROKEN)
        for index in (0, 1):
            share = for_prompt(answer, index, 1).observed
            assert (share.outcome, share.error) == ("error", "upstream connection broke")

    def test_error_event_message_is_every_prompts(self) -> None:
        body = sse(comp("a", index=0, finish="stop"), {"error": {"message": "engine died"}})
        answer = final(body, n=2)
        for index in (0, 1):
            share = for_prompt(answer, index, 1).observed
            assert (share.outcome, share.error) == ("error", "engine died")

    def test_cancelled_stays_cancelled(self) -> None:
        body = sse(comp("a", index=0, finish="stop"), comp("b", index=1, finish="stop"))
        answer = final(body, n=2, end=EndKind.CLIENT_GONE)
        assert for_prompt(answer, 0, 1).observed.outcome == "cancelled"
