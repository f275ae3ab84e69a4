"""The work budget of one request: checked before the work it bounds, every excess
counted with its reason; incremental encoding wired into the prompt, exactly."""

from __future__ import annotations

import base64
import inspect
import json
import time
import zlib

import attrs
import pytest

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.budget import (
    EVENT_SLACK,
    EVENTS_PER_TOKEN,
    MAX_BYTES_PER_TOKEN,
    Budget,
    chat_text_over,
    longest_token_bytes,
    response_events,
    text_over,
)
from shadow_proxy.worker.request.fields import NotMirrored
from shadow_proxy.worker.request.incremental import IncrementalEncoder
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import LoadedModel, load_model
from shadow_proxy.worker.response.recorder import ResponseRecorder


@pytest.fixture(scope="module")
def deepseek(model_dirs) -> LoadedModel:
    return load_model("deepseek", str(model_dirs["deepseek"]))


class CountingTemplate:
    """The model's compiled chat template, counting its renders."""

    def __init__(self, template):
        self.template = template
        self.renders = 0

    def render(self, context):
        self.renders += 1
        return self.template.render(context)


def with_budget(model: LoadedModel, limit: int | None, encoder: bool = True) -> LoadedModel:
    return attrs.evolve(
        model,
        max_prompt_bytes=limit,
        prompt_encoder=IncrementalEncoder.for_tokenizer(model.backend) if encoder else None,
        chat_template=CountingTemplate(model.chat_template),
    )


def tools(n: int, properties: int) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{t}",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{i}": {"type": "string"} for i in range(properties)},
                },
            },
        }
        for t in range(n)
    ]


def preprocess(model: LoadedModel, request: dict):
    body = json.dumps({"model": "deepseek", **request}).encode()
    return Preprocessor({"deepseek": model}).preprocess(Route.CHAT, body, 0)


class TestEstimates:
    def test_chat_text_counts_contents_parts_and_tools(self):
        messages = [
            {"role": "user", "content": "x" * 60},
            {"role": "user", "content": [{"type": "text", "text": "y" * 30}, {"type": "image"}]},
        ]
        assert not chat_text_over(messages, None, 90)
        assert chat_text_over(messages, None, 89)
        big = tools(3, 50)
        size = sum(len(json.dumps(t, ensure_ascii=False)) for t in big)
        assert chat_text_over(messages, big, 89 + size)
        assert not chat_text_over(messages, big, 90 + size)

    def test_text_in_utf8_bytes(self):
        assert not text_over("é" * 50, 100)
        assert text_over("é" * 51, 100)
        assert text_over("\ud800" * 40, 100)  # a lone surrogate (valid JSON) counts, never raises

    def test_derived_from_context_and_longest_token(self, deepseek):
        longest = longest_token_bytes(deepseek.backend)
        assert longest >= len("<｜begin▁of▁sentence｜>".encode())
        assert longest > MAX_BYTES_PER_TOKEN
        assert Budget().prompt_bytes(32768, longest) == 32768 * MAX_BYTES_PER_TOKEN  # 1 MiB
        assert Budget().prompt_bytes(32768, 5) == 32768 * 5
        assert Budget().prompt_bytes(None, longest) == 131072 * MAX_BYTES_PER_TOKEN
        assert Budget(max_prompt_bytes=1000).prompt_bytes(32768, longest) == 1000

    def test_realistic_text_well_within(self, deepseek):
        """Prose, code, CJK and base64 average far fewer bytes per token than the
        bound: a prompt that fits the context fits the budget."""
        texts = [
            inspect.getsource(json),
            "Shadow deployments get a live copy of production requests. " * 200,
            "日本語のテキスト" * 500,
            base64.b64encode(bytes(range(256)) * 40).decode(),
            "\n".join(" " * 16 + "x = compute(y)" for _ in range(300)),
        ]
        for text in texts:
            ids = deepseek.backend.encode(text, add_special_tokens=False).ids
            assert len(text.encode()) / len(ids) < MAX_BYTES_PER_TOKEN / 4


class TestPromptBudget:
    """Past max_prompt_bytes a request is not mirrored, and nothing is encoded."""

    def test_tools_over_the_budget_are_never_rendered(self, deepseek):
        model = with_budget(deepseek, 200_000)
        request = {"messages": [{"role": "user", "content": "hi"}], "tools": tools(40, 200)}
        result = preprocess(model, request)
        assert result == NotMirrored("prompt_over_budget")
        assert model.chat_template.renders == 0
        assert model.prompt_encoder.returned_tokens == 0

    def test_rendered_text_over_the_budget_is_not_encoded(self, deepseek):
        content = "word " * 100
        model = with_budget(deepseek, len(content) + 5)  # the messages fit, the template adds
        assert preprocess(model, {"messages": [{"role": "user", "content": content}]}) == (
            NotMirrored("prompt_over_budget")
        )
        assert model.chat_template.renders == 1
        assert model.prompt_encoder.returned_tokens == 0

    def test_within_the_budget_same_ids(self, deepseek):
        request = {"messages": [{"role": "user", "content": "hello there"}], "tools": tools(2, 3)}
        plain = preprocess(deepseek, request)
        budgeted = preprocess(with_budget(deepseek, 100_000), request)
        assert isinstance(plain, PreprocessedRequest)
        assert budgeted.token_ids == plain.token_ids


class TestIncrementalInThePreprocessor:
    """The worker's prompts go through the incremental encoder: same ids, fewer encoded."""

    def test_next_turn_reuses_the_conversation(self, deepseek):
        model = with_budget(deepseek, None)
        encoder = model.prompt_encoder
        turns = [{"role": "system", "content": "You are terse. " * 50}]
        for i in range(6):
            turns.append({"role": "user", "content": f"question {i} " * 30})
            got = preprocess(model, {"messages": turns})
            assert got.token_ids == preprocess(deepseek, {"messages": turns}).token_ids
            turns.append({"role": "assistant", "content": f"answer {i} " * 30})
        assert encoder.encoded_tokens < 0.5 * encoder.returned_tokens


class TestDecodedBytes:
    """A content-encoded body decodes to at most max_decoded_bytes; the record keeps
    what was read and says why it stopped."""

    def test_gzip_bomb_stops_at_the_bound(self):
        event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        body = event * 200_000  # about 11 MB
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        encoded = compressor.compress(body) + compressor.flush()
        assert len(encoded) < len(body) // 100
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_decoded_bytes=1 << 20)
        recorder.head(200, "text/event-stream", "gzip", 1)
        for start in range(0, len(encoded), 4096):
            recorder.feed(encoded[start : start + 4096], 2)
        observed = recorder.finish(EndKind.CLEAN, 3)
        assert recorder.gave_up is not None and "work budget" in recorder.gave_up
        assert observed.outcome == "incomplete"
        assert "work budget" in (observed.body_problem or "")
        (choice,) = observed.choices
        read = len(choice.text)
        assert 0.8 * (1 << 20) / len(event) < read <= (1 << 20) / len(event) + 1

    def test_identity_bodies_are_not_bounded_here(self):
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_decoded_bytes=100)
        recorder.head(200, "text/event-stream", "", 1)
        event = (
            b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
        )
        recorder.feed(event * 10, 2)
        assert recorder.gave_up is None
        assert recorder.finish(EndKind.CLEAN, 3).outcome == "complete"


EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


def gzipped(body: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(body) + compressor.flush()


class TestEvents:
    """A stream is read for at most the events its request accounts for: n x
    max_tokens (or the context length) x EVENTS_PER_TOKEN, plus EVENT_SLACK."""

    def test_bound_from_the_request(self):
        assert response_events(1, 4, 32768) == 4 * EVENTS_PER_TOKEN + EVENT_SLACK
        assert response_events(2, None, 32768) == 2 * 32768 * EVENTS_PER_TOKEN + EVENT_SLACK
        assert response_events(1, None, None) is None

    def test_stops_after_the_bound(self):
        limit = response_events(1, 4, None)
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_events=limit)
        recorder.head(200, "text/event-stream", "", 1)
        recorder.feed(EVENT * 1000, 2)
        observed = recorder.finish(EndKind.CLEAN, 3)
        assert recorder.gave_up_on == "events"
        assert observed.outcome == "incomplete"
        assert "events" in (observed.body_problem or "")
        (choice,) = observed.choices
        assert len(choice.text) == limit  # every event up to the bound, none after

    def test_a_stream_within_the_bound_is_whole(self):
        done = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_events=11)
        recorder.head(200, "text/event-stream", "", 1)
        recorder.feed(EVENT * 10 + done, 2)
        assert recorder.gave_up is None
        assert recorder.finish(EndKind.CLEAN, 3).outcome == "complete"


class TestCpuWithinAChunk:
    """The CPU deadline is checked between the decoded pieces of one chunk: a small
    compressed chunk that decodes to millions of events stops near its budget."""

    def test_one_chunk_stops_at_the_deadline(self):
        body = EVENT * 400_000  # 22 MB, 86 decoded pieces of 256 KiB
        encoded = gzipped(body)
        assert len(encoded) < 128 * 1024
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, "text/event-stream", "gzip", 1)
        recorder.cpu_deadline = time.thread_time() + 0.02
        recorder.cpu_reason = "work budget: over 0.02 s of CPU"
        recorder.feed(encoded, 2)  # the whole body in one chunk
        observed = recorder.finish(EndKind.CLEAN, 3)
        assert recorder.gave_up_on == "cpu"
        assert observed.body_problem == "work budget: over 0.02 s of CPU"
        (choice,) = observed.choices
        assert len(choice.text) < 400_000 // 4
