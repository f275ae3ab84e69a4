"""Incremental tokenization against the real Dynamo frontend (issue 19): multi-turn
conversations, each turn's prompt rebuilt by reusing the cached segments of the turns
before, has exactly the prompt tokens Dynamo reports (the mismatch metric stays 0)."""

from __future__ import annotations

import random

import pytest

from shadow_proxy.devtools.loadgen import make_prompt
from shadow_proxy.devtools.processes import wait_until as wait_for
from tests.integration.test_dynamo import JOINED, Stack, dynamo, send_all  # noqa: F401 (a fixture)
from tests.integration.test_dynamo import stack as stack  # the fixture

pytestmark = [pytest.mark.dynamo, pytest.mark.asyncio(loop_scope="module")]


def conversations(seed: int = 11) -> list[tuple[str, dict]]:
    """Turn by turn, interleaved like agent traffic: each request repeats the
    conversation so far (system prompt, earlier turns, tool results) and adds one."""
    rng = random.Random(seed)
    talks = []
    for c in range(8):
        model = "deepseek" if c % 2 == 0 else "chatml"
        system = "You are an agent. " + make_prompt(rng, 200)
        talks.append((model, [{"role": "system", "content": system}]))
    out = []
    for turn in range(8):
        for model, messages in talks:
            messages.append({"role": "user", "content": make_prompt(rng, rng.randint(20, 120))})
            body = {"model": model, "messages": [dict(m) for m in messages], "max_tokens": 2}
            out.append(("chat", body))
            reply = make_prompt(rng, rng.randint(10, 60))
            messages.append({"role": "assistant", "content": reply})
            if turn % 3 == 2:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": f"call-{turn}",
                        "content": f"result {turn}: " + reply,
                    }
                )
    return out


class TestMultiTurn:
    async def test_prompt_tokens_equal_dynamo_and_segments_reused(self, stack: Stack) -> None:
        requests = conversations()
        answers = await send_all(stack.url, requests)
        failed = [(a.status, a.body[:300]) for a in answers if a.status != 200]
        assert not failed, failed[:3]
        joined = await stack.records(JOINED, [a.request_id for a in answers])
        for answer in answers:
            record = joined[answer.request_id]
            assert len(record["request"]["token_ids"]) == answer.usage["prompt_tokens"]
        await wait_for(lambda: stack.metric("shadow_tokenizer_tokens_total") > 0, timeout=10)
        assert stack.metric("shadow_prompt_token_mismatches_total") == 0
        reused = sum(
            sample.value
            for family in stack.registry.collect()
            for sample in family.samples
            if sample.name == "shadow_tokenizer_tokens_total"
            and sample.labels["source"] == "reused"
        )
        assert reused > 0.5 * stack.metric("shadow_tokenizer_tokens_total")
