"""The prompt's token ids: chat templates, multimodal parts, completions prompts."""

from __future__ import annotations

from typing import ClassVar

import pytest

from shadow_proxy.devtools import modeldirs
from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request import prompt
from shadow_proxy.worker.request.fields import Reject
from tests.support.requests import (
    CHAT_CASES,
    MODELS,
    expected_chat_ids,
    run,
)


class TestChatTokens:
    """Chat token ids equal the tokenizer's own apply_chat_template with the generation prompt."""

    @pytest.mark.parametrize("model_name", MODELS)
    @pytest.mark.parametrize("case", sorted(CHAT_CASES))
    def test_ids_match_apply_chat_template(self, preprocessor, loaded, model_name, case):
        request = {"model": model_name, **CHAT_CASES[case]}
        result = run(preprocessor, Route.CHAT, request)
        assert isinstance(result, PreprocessedRequest), result
        assert result.token_ids == expected_chat_ids(loaded[model_name], request)
        assert result.model == model_name

    def test_thinking_switch_changes_the_chatml_prompt(self, preprocessor):
        base = {"model": "chatml", "messages": [{"role": "user", "content": "hi"}]}
        plain = run(preprocessor, Route.CHAT, base)
        off = run(
            preprocessor, Route.CHAT, {**base, "chat_template_kwargs": {"enable_thinking": False}}
        )
        assert len(off.token_ids) > len(plain.token_ids)

    def test_generation_prompt_is_added(self, preprocessor, loaded):
        result = run(preprocessor, Route.CHAT, {"model": "deepseek", **CHAT_CASES["single_turn"]})
        assert loaded["deepseek"].tokenizer.decode(result.token_ids).endswith("<｜Assistant｜>")

    def test_nul_characters_are_kept_for_vllm(self, preprocessor):
        """vLLM encodes NULs (Dynamo strips them: ``TestEncode``)."""
        with_nul = {"model": "chatml", "messages": [{"role": "user", "content": "a\0b"}]}
        without = {"model": "chatml", "messages": [{"role": "user", "content": "ab"}]}
        assert run(preprocessor, Route.CHAT, with_nul).token_ids != (
            run(preprocessor, Route.CHAT, without).token_ids
        )


class TestMultimodal:
    """Media parts of user messages become URL references; text parts still render."""

    def test_media_urls(self, preprocessor, loaded):
        request = {
            "model": "chatml",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                        {"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}},
                    ],
                }
            ],
        }
        result = run(preprocessor, Route.CHAT, request)
        assert result.multi_modal_data == {
            "image_url": [{"Url": "https://x/a.png"}, {"Url": "data:image/png;base64,AA=="}],
            "audio_url": [{"Url": "https://x/a.wav"}],
        }
        assert result.token_ids == expected_chat_ids(loaded["chatml"], request)
        assert "max_tokens" not in result.stop_conditions  # left to the engine, as Dynamo

    def test_prompt_embeds(self, preprocessor):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt_embeds": "AAAA"})
        assert result.token_ids == []
        assert result.multi_modal_data == {"prompt_embeds": "AAAA"}
        assert result.has_multimodal


class TestCompletions:
    """Completions: a string is encoded as is, ids are used as given, batches are not mirrored."""

    @pytest.mark.parametrize("model_name", MODELS)
    def test_string_prompt_without_special_tokens(self, preprocessor, loaded, model_name):
        prompt = "Once upon a time 😀"
        result = run(preprocessor, Route.COMPLETIONS, {"model": model_name, "prompt": prompt})
        tokenizer = loaded[model_name].tokenizer
        assert result.token_ids == tokenizer.encode(prompt, add_special_tokens=False)
        assert "max_tokens" not in result.stop_conditions

    @pytest.mark.parametrize(
        ("prompt", "ids"),
        [([3, 4, 5], [3, 4, 5]), ([[3, 4]], [3, 4])],
    )
    def test_token_prompts(self, preprocessor, prompt, ids):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt": prompt})
        assert result.token_ids == ids

    def test_one_element_string_list(self, preprocessor, loaded):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "deepseek", "prompt": ["abc def"]})
        expected = loaded["deepseek"].tokenizer.encode("abc def", add_special_tokens=False)
        assert result.token_ids == expected

    def test_batches_are_one_request_per_prompt(self, preprocessor):
        # (issue 16; the batch rules are tested in tests/unit/worker/request/test_batch.py)
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt": [[1], [2]]})
        assert [r.token_ids for r in result.requests] == [[1], [2]]

    def test_prompt_filling_the_context_is_mirrored(self, preprocessor):
        # The frontend decides (a 400, or served): the record shows which.
        request = {"model": "chatml", "prompt": [1] * modeldirs.CHATML_CONTEXT_LENGTH}
        result = run(preprocessor, Route.COMPLETIONS, request)
        assert len(result.token_ids) == modeldirs.CHATML_CONTEXT_LENGTH


class TestDirect:
    """The prompt functions called directly, on a real tokenizer."""

    def test_nul_characters_are_stripped(self, loaded) -> None:
        model = loaded["deepseek"]
        assert prompt.encode(model, "a\0b") == prompt.encode(model, "ab")

    def test_token_list(self) -> None:
        assert prompt.token_list([0, 5, 2**32 - 1]) == [0, 5, 2**32 - 1]
        for bad in ([2**32], [-1], [True], [1.0], "1,2", None):
            with pytest.raises(Reject, match="invalid_field"):
                prompt.token_list(bad)

    def test_completion_prompts(self, loaded) -> None:
        model, media = loaded["chatml"], {}
        assert prompt.completion_tokens(model, {"prompt": [7, 8]}, media) == [7, 8]
        assert prompt.completion_tokens(model, {"prompt": [[7, 8]]}, media) == [7, 8]
        assert prompt.completion_tokens(model, {"prompt": ["hi"]}, media) == model.encode("hi")
        with pytest.raises(Reject, match="batch_prompt"):
            prompt.completion_tokens(model, {"prompt": ["a", "b"]}, media)
        with pytest.raises(Reject, match="missing_prompt"):
            prompt.completion_tokens(model, {}, media)
        assert prompt.completion_tokens(model, {"prompt_embeds": "AAAA"}, media) == []
        assert media == {prompt.PROMPT_EMBEDS_KEY: "AAAA"}


class TestSpansWithThePromptEncoder:
    """The spans' encodes go through the prompt encoder: the same spans as full
    encodes, found in its cache (no tokenizer call), not counted as prompt tokens."""

    @pytest.mark.parametrize("model_name", MODELS)
    def test_same_spans_from_the_cache(self, model_dirs, model_name):
        import attrs

        from shadow_proxy.worker.request.incremental import IncrementalEncoder
        from shadow_proxy.worker.request.preprocess import Preprocessor
        from shadow_proxy.worker.request.tokenizer import load_model

        plain = load_model(model_name, str(model_dirs[model_name]))
        encoder = IncrementalEncoder.for_tokenizer(plain.backend)
        assert encoder.segmenter is not None
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "Four, as it happens."},
            {"role": "user", "content": "And 3+3?"},
        ]
        request = {"model": model_name, "messages": messages}
        want = run(Preprocessor({model_name: plain}), Route.CHAT, request)
        calls = []
        tokenizer = encoder.tokenizer

        class Counting:
            def encode_batch_fast(self, texts, **options):
                calls.append(texts)
                return tokenizer.encode_batch_fast(texts, **options)

            def __getattr__(self, name):
                return getattr(tokenizer, name)

        encoder.tokenizer = counting = Counting()
        cached = attrs.evolve(plain, backend=counting, prompt_encoder=encoder)
        got = run(Preprocessor({model_name: cached}), Route.CHAT, request)
        assert isinstance(got, PreprocessedRequest) and isinstance(want, PreprocessedRequest)
        assert got.prompt_spans is not None
        assert (got.token_ids, got.prompt_spans) == (want.token_ids, want.prompt_spans)
        assert len(calls) == 1  # the prompt's segments; the spans' come from the cache
        assert encoder.returned_tokens == len(got.token_ids)


def reading_model(model_dirs, path, reads: str):
    """The ChatML model's files in ``path`` with a template that reads each content
    as ``TestHeldRenders.READING[reads]`` says; ``path``."""
    import json

    template = (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        + TestHeldRenders.READING[reads]
        + "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    source = model_dirs["chatml"]
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    for name in ("tokenizer.json", "config.json", "generation_config.json"):
        (path / name).write_bytes((source / name).read_bytes())
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


class TestHeldRenders:
    """The spans' prefix renders with long contents held out give the very spans
    the full renders give, over the fidelity corpus and long conversations, on
    both template engines; a template that decides on a content is left to the
    full renders."""

    ENGINES = ("minijinja", "jinja2")

    @staticmethod
    def cases() -> list[dict]:
        import json
        from pathlib import Path

        corpus = Path(__file__).parents[3] / "data" / "fidelity" / "corpus.jsonl"
        bodies = []
        for line in corpus.read_text().split("\n"):
            case = json.loads(line) if line else None
            if case and case["api"] == "chat":
                messages = case["body"].get("messages") or []
                if any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
                    bodies.append(case["body"])
        long = "A long answer, with <b>markup</b>, \u00e9 and \U0001f600. " * 8
        for turns in (1, 3):
            messages: list[dict] = [{"role": "system", "content": "Be brief. " * 10}]
            for k in range(turns):
                messages += [
                    {"role": "user", "content": f"Question {k}: " + "why? " * 20},
                    {"role": "assistant", "content": f"{k}. {long}"},
                ]
            bodies.append({"messages": [*messages, {"role": "user", "content": "And?"}]})
        return bodies

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("model_name", MODELS)
    def test_same_spans(self, model_dirs, model_name, engine, monkeypatch):
        import json

        from shadow_proxy.worker.request.preprocess import Preprocessor
        from shadow_proxy.worker.request.tokenizer import load_model

        model = load_model(model_name, str(model_dirs[model_name]), None, template_engine=engine)
        pre = Preprocessor({model_name: model})
        light = 0
        held, spans = prompt._held_renders, prompt.answer_spans
        for body in self.cases():
            raw = json.dumps({**body, "model": model_name}).encode()
            calls: list[bool] = []  # per call: held renders given, or an answer placed

            def counted(*args, _calls=calls):
                out = spans(*args)
                _calls.append(out is not None)
                return out

            def given(*args, _calls=calls):
                out = held(*args)
                _calls.append(out is not None)
                return out

            monkeypatch.setattr(prompt, "answer_spans", counted)
            monkeypatch.setattr(prompt, "_held_renders", given)
            got = pre.preprocess(Route.CHAT, raw, 0)
            monkeypatch.setattr(prompt, "_held_renders", lambda *args: None)
            want = pre.preprocess(Route.CHAT, raw, 0)
            assert got == want
            # Held renders given, and they placed the answer (no fall-back).
            light += calls[:3] == [True, True, True] and len(calls) == 3
        assert light >= 2, "the held renders never placed an answer"

    #: ChatML templates that read each content: trim it (Llama 3 does), cut a
    #: thought out of earlier answers (DeepSeek R1, Qwen 3 do), decide on its
    #: length, rewrite it whole (the probe shows it) or a word of it at the
    #: same length (only the content check shows it).
    READING: ClassVar[dict[str, str]] = {
        "trim": "{{ message['content'] | trim }}",
        "split": "{{ message['content'].split('</think>')[-1] }}",
        "length": "{% if message['content'] | length > 70 %}[long]{% endif %}"
        "{{ message['content'] }}",
        "upper": "{{ message['content'] | upper }}",
        "replace": "{{ message['content'] | replace('said', 'told') }}",
    }

    @pytest.mark.parametrize("reads", READING)
    def test_a_template_that_reads_the_content(self, model_dirs, tmp_path, reads):
        """The held renders' spans are the full renders' (or neither has any): the
        checks on the prompt's text and ids refuse what a template made of a
        held content, and the full renders decide."""
        import json

        from shadow_proxy.worker.request.preprocess import Preprocessor
        from shadow_proxy.worker.request.tokenizer import load_model

        pre = Preprocessor({"m": load_model("m", str(reading_model(model_dirs, tmp_path, reads)))})
        for answer in ("  spaced " * 10, "<think>hm</think>" + "said " * 20, "plain " * 20):
            messages = [
                {"role": "user", "content": " q " * 30},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "and?"},
            ]
            raw = json.dumps({"model": "m", "messages": messages}).encode()
            got = pre.preprocess(Route.CHAT, raw, 0)
            held = prompt._held_renders
            try:
                prompt._held_renders = lambda *args: None
                want = pre.preprocess(Route.CHAT, raw, 0)
            finally:
                prompt._held_renders = held
            assert got == want, (reads, answer)
