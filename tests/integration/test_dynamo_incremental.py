"""Incremental tokenization against the real Dynamo frontend (issue 19): multi-turn
conversations, each turn's prompt rebuilt by reusing the cached segments of the turns
before, has exactly the prompt tokens Dynamo reports (the mismatch metric stays 0)."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest

from shadow_proxy.devtools.loadgen import make_prompt
from shadow_proxy.devtools.processes import wait_until as wait_for
from tests.integration.test_dynamo import JOINED, TIMEOUT, Stack, dynamo, send  # noqa: F401
from tests.integration.test_dynamo import stack as stack  # the fixture

pytestmark = [pytest.mark.dynamo, pytest.mark.asyncio(loop_scope="module")]


def turns(seed: int = 11, conversations: int = 8) -> list[list[tuple[str, dict]]]:
    """Turn by turn, interleaved like agent traffic: per turn, one request of each
    conversation (with its name), repeating the conversation so far (system prompt,
    earlier turns, tool results) and adding one."""
    rng = random.Random(seed)
    talks = []
    for c in range(conversations):
        model = "deepseek" if c % 2 == 0 else "chatml"
        system = "You are an agent. " + make_prompt(rng, 200)
        talks.append((model, [{"role": "system", "content": system}]))
    out = []
    for turn in range(8):
        this_turn = []
        for c, (model, messages) in enumerate(talks):
            messages.append({"role": "user", "content": make_prompt(rng, rng.randint(20, 120))})
            body = {"model": model, "messages": [dict(m) for m in messages], "max_tokens": 2}
            this_turn.append((f"conversation-{c}", body))
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
        out.append(this_turn)
    return out


class TestMultiTurn:
    async def test_prompt_tokens_equal_dynamo_and_segments_reused(self, stack: Stack) -> None:
        """Each conversation names itself (``x-session-id``), so its turns meet in one
        shard's cache, and a turn is sent once the turn before is recorded, as a client
        waits for its answer: what is reused depends on the cache, not on timing."""
        answers = []
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            for this_turn in turns():
                sent = await asyncio.gather(
                    *(
                        send(session, stack.url, "chat", body, {"x-session-id": name})
                        for name, body in this_turn
                    )
                )
                failed = [(a.status, a.body[:300]) for a in sent if a.status != 200]
                assert not failed, failed[:3]
                await stack.records(JOINED, [a.request_id for a in sent])
                answers += sent
        joined = await stack.records(JOINED, [a.request_id for a in answers])
        for answer in answers:
            record = joined[answer.request_id]
            assert len(record["request"]["token_ids"]) == answer.usage["prompt_tokens"]
        # The shards' counters reach the registry a relay at a time: wait for every
        # prompt's tokens, then read both sources from one collection.
        prompt_tokens = sum(a.usage["prompt_tokens"] for a in answers)
        await wait_for(
            lambda: stack.metric("shadow_tokenizer_tokens_total") == prompt_tokens, timeout=10
        )
        assert stack.metric("shadow_prompt_token_mismatches_total") == 0
        by_source = {"encoded": 0.0, "reused": 0.0}
        for family in stack.registry.collect():
            for sample in family.samples:
                if sample.name == "shadow_tokenizer_tokens_total":
                    by_source[sample.labels["source"]] += sample.value
        print(f"prompt tokens by source: {by_source}")
        assert sum(by_source.values()) == prompt_tokens
        # All but each conversation's first turn and each turn's new messages: 81%.
        # Turns routed without their conversation's name reuse about 69%.
        assert by_source["reused"] > 0.75 * prompt_tokens
