"""Incremental tokenization: ids identical to a full encode, on both real tokenizers."""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.incremental import IncrementalEncoder, TokenIds
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.segment_cache import SegmentCache
from shadow_proxy.worker.request.segments import Segmenter
from shadow_proxy.worker.request.tokenizer import LoadedModel, load_model

MODELS = ("deepseek", "chatml")
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that stresses the cut points: every special token of both models, pieces of
# them, whitespace of all kinds (at segment edges too), combining marks that NFC
# composes, digits the pre-tokenizers split, CJK, emoji.
FRAGMENTS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_",
    "start|>",
    "<|",
    "|>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜place▁holder▁no▁1｜>",
    "<｜place▁holder▁no▁10｜>",
    "<｜table｜>",
    "<think>",
    "</think>",
    "<｜",
    "｜>",
    "User｜>",
    "▁",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "\u3000",
    "\u2028",
    " \n ",
    "e\u0301",
    "\u0301",
    "\u0308",
    "é",
    "12345",
    "3.14",
    "日本語テキスト",
    "中文",
    "문장",
    "😀",
    "🚀✨",
    "def f(x):\n    return x",
    "Hello",
    " world",
    "!",
    "'s",
    "<",
    ">",
]
CONTENT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=10)), max_size=8).map(
    "".join
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": CONTENT}
).map(lambda m: {**m, "tool_call_id": "call-1"} if m["role"] == "tool" else m)
CONVERSATION = st.lists(MESSAGE, min_size=1, max_size=8)


@pytest.fixture(scope="module")
def loaded(model_dirs) -> dict[str, LoadedModel]:
    return {name: load_model(name, str(model_dirs[name])) for name in MODELS}


@pytest.fixture(scope="module")
def encoders(loaded) -> dict[str, IncrementalEncoder]:
    """As the worker builds them (``shard_setup.load_models``)."""
    out = {}
    for name, model in loaded.items():
        out[name] = IncrementalEncoder.for_tokenizer(model.backend)
        out[name].learn_answer_gap(model.chat_template.render)
    return out


def render(model: LoadedModel, messages: list[dict]) -> str:
    """The prompt text the worker encodes (prompt.py renders the request this way)."""
    return model.chat_template.render({"messages": messages}).replace("\0", "")


def fresh(encoder: IncrementalEncoder) -> IncrementalEncoder:
    """The same checked segmenter with an empty cache (the check costs ~0.2 s)."""
    return IncrementalEncoder(
        encoder.tokenizer,
        encoder.segmenter,
        SegmentCache(),
        answer_prefix=encoder.answer_prefix,
        answer_suffix=encoder.answer_suffix,
    )


def full(model: LoadedModel, text: str) -> list[int]:
    return model.backend.encode(text, add_special_tokens=False).ids


class TestEnabledForLocalModels:
    """Both local tokenizers pass the check; DeepSeek is also cut at its turn markers."""

    def test_both_enabled(self, encoders):
        for name, encoder in encoders.items():
            assert encoder.fallback_reason is None, name

    def test_deepseek_cuts_at_turn_markers(self, loaded, encoders):
        model, encoder = loaded["deepseek"], encoders["deepseek"]
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second"},
        ]
        pieces = encoder.segmenter.split(render(model, messages))
        assert [p for p in pieces if isinstance(p, str)] == [
            "Be brief.",
            "first question",
            "first answer",
            "second",
        ]

    def test_chatml_cuts_at_im_tokens(self, loaded, encoders):
        model, encoder = loaded["chatml"], encoders["chatml"]
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        pieces = encoder.segmenter.split(render(model, messages))
        assert [p for p in pieces if isinstance(p, str)] == [
            "user\nhi",
            "\n",
            "assistant\nyo",
            "\n",
            "assistant\n",
        ]


class TestExactOnTemplatedConversations:
    """encode(prompt) equals a full encode for any conversation, cache cold or warm."""

    @pytest.mark.parametrize("name", MODELS)
    @PROPERTY
    @given(messages=CONVERSATION)
    def test_random_conversations(self, loaded, encoders, name, messages):
        model, encoder = loaded[name], encoders[name]
        text = render(model, messages)
        assert encoder.encode(text) == full(model, text)

    @pytest.mark.parametrize("name", MODELS)
    @PROPERTY
    @given(messages=st.lists(MESSAGE, min_size=2, max_size=12))
    def test_growing_conversation(self, loaded, encoders, name, messages):
        """Turn after turn through one encoder: the later turns reuse cached segments."""
        model = loaded[name]
        encoder = fresh(encoders[name])
        for turn in range(1, len(messages) + 1):
            text = render(model, messages[:turn])
            assert encoder.encode(text) == full(model, text), turn

    @pytest.mark.parametrize("name", MODELS)
    def test_same_ids_as_the_worker_preprocessor(self, loaded, encoders, name):
        """The helper renders what the worker encodes: same ids as Preprocessor."""
        model, encoder = loaded[name], encoders[name]
        messages = [
            {"role": "system", "content": " sys <|im_end|>\n"},
            {"role": "user", "content": [{"type": "text", "text": t} for t in ("a", " ")]},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "<｜User｜> ok\u0301 "},
        ]
        body = json.dumps({"model": name, "messages": messages}).encode()
        pre = Preprocessor({name: model}).preprocess(Route.CHAT, body, 0)
        assert isinstance(pre, PreprocessedRequest)
        assert encoder.encode(render(model, messages)) == pre.token_ids

    @pytest.mark.parametrize("name", MODELS)
    @PROPERTY
    @given(texts=st.lists(CONTENT, min_size=1, max_size=6))
    def test_raw_texts_in_one_batch(self, loaded, encoders, name, texts):
        """Any text (completions prompts too), several per call, NUL included."""
        model, encoder = loaded[name], encoders[name]
        texts = [*texts, "\0" + texts[0]]
        assert encoder.encode_many(texts) == [full(model, text) for text in texts]


def converse(
    model, encoder, turns: int, answer: Callable[[int], str], *, outputs: bool
) -> tuple[list[int], str]:
    """A conversation turn by turn through ``encoder`` (each prompt checked against a
    full encode); ``outputs``: each answer also goes through ``encode_output``, as
    the worker encodes it for its record. Returns the tokens each turn encoded,
    and the last prompt."""
    history = [{"role": "system", "content": "You are terse. " * 50}]
    encoded = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"question {turn} " * 20})
        text = render(model, history)
        before = encoder.encoded_tokens
        assert encoder.encode(text) == full(model, text)
        encoded.append(encoder.encoded_tokens - before)
        if outputs:
            assert encoder.encode_output(answer(turn)) == full(model, answer(turn))
        history.append({"role": "assistant", "content": answer(turn)})
    return encoded, text


class TestReuse:
    """A conversation's next turn encodes only what is new."""

    @pytest.mark.parametrize("name", MODELS)
    def test_next_turn_encodes_only_new_segments(self, loaded, encoders, name):
        model = loaded[name]
        encoder = fresh(encoders[name])
        encoded, last = converse(model, encoder, 6, lambda t: f"answer {t} " * 40, outputs=False)
        assert encoded[-1] < len(full(model, last)) * 0.25
        assert encoder.cache.hits > 0
        assert encoder.encoded_tokens < encoder.returned_tokens * 0.5

    @pytest.mark.parametrize("name", MODELS)
    def test_answers_kept_for_the_next_turn(self, loaded, encoders, name):
        """The worker encodes each answer's text for its record (``encode_output``);
        the next turn, which resends it, encodes only the new user message."""
        model = loaded[name]
        encoder = fresh(encoders[name])

        def answer(turn: int) -> str:
            return f"answer {turn}, at length: " + "and so on " * 60

        encoded, _ = converse(model, encoder, 5, answer, outputs=True)
        question = len(full(model, "question 4 " * 20))
        assert encoded[-1] < question + 20, (encoded, question)  # not the answer's 180 again

    def test_a_second_encode_only_for_conversations(self, loaded, encoders):
        """ChatML wraps the answer ("assistant\\n" before it): keeping its piece is a
        second encode, done only when the request named its session; DeepSeek's
        piece is the answer itself, kept at no cost either way."""
        chatml, deepseek = fresh(encoders["chatml"]), fresh(encoders["deepseek"])
        answer = "a single-turn answer"
        assert chatml.encode_output(answer, conversation=False) == full(loaded["chatml"], answer)
        assert len(chatml.cache) == 0
        chatml.encode_output(answer, conversation=True)
        assert len(chatml.cache) == 1
        deepseek.encode_output(answer, conversation=False)
        assert len(deepseek.cache) == 1

    def test_where_each_template_puts_an_answer(self, encoders):
        assert (encoders["deepseek"].answer_prefix, encoders["deepseek"].answer_suffix) == ("", "")
        assert (encoders["chatml"].answer_prefix, encoders["chatml"].answer_suffix) == (
            "assistant\n",
            "",
        )

    def test_a_failing_template_keeps_no_answers(self, loaded, encoders):
        encoder = fresh(encoders["deepseek"])

        def broken(request: dict) -> str:
            raise ValueError("no")

        encoder.learn_answer_gap(broken)
        assert encoder.answer_prefix is None
        assert encoder.encode_output("an answer") == full(loaded["deepseek"], "an answer")
        assert len(encoder.cache) == 0

    @pytest.mark.parametrize("name", MODELS)
    def test_answers_with_cut_tokens_stay_exact(self, loaded, encoders, name):
        """An answer that spells a cut token (or is empty) is kept under its own text:
        prompts that contain it, whole or cut, still encode exactly."""
        model = loaded[name]
        encoder = fresh(encoders[name])
        for cut in [*encoder.segmenter.cut_tokens[:4], ""]:
            answer = f"see {cut} here"
            assert encoder.encode_output(answer) == full(model, answer)
            assert encoder.encode_output("") == []
            messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]
            text = render(model, messages)
            assert encoder.encode(text) == full(model, text)
            assert encoder.encode(answer) == full(model, answer)

    def test_second_cut_only_for_new_gaps(self, loaded, encoders):
        """DeepSeek's turn markers are normalized tokens: a gap of the first cut
        seen before is reused whole, not cut again (the second cut scans the
        text without a literal prefix, the dearer of the two)."""
        model = loaded["deepseek"]
        cut: list[str] = []

        class Counting(Segmenter):
            def split_normalized(self, gap: str) -> list[str | int]:
                cut.append(gap)
                return super().split_normalized(gap)

        checked = encoders["deepseek"]
        segmenter = Counting(**attrs.asdict(checked.segmenter, recurse=False))
        encoder = IncrementalEncoder(checked.tokenizer, segmenter, SegmentCache())
        history = [{"role": "system", "content": "Be brief."}]
        for turn in range(4):
            history += [
                {"role": "user", "content": f"question {turn}"},
                {"role": "assistant", "content": f"answer {turn}"},
            ]
        history.append({"role": "user", "content": "last"})
        text = render(model, history)
        gaps = [g for g in encoder.segmenter.split_raw(text) if isinstance(g, str)]
        assert len(gaps) == 5  # each finished turn ends with the end-of-sentence token
        encoder.encode(text)
        assert cut == gaps
        cut.clear()
        history += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
        text = render(model, history)
        assert encoder.encode(text) == full(model, text)
        assert cut == [g for g in encoder.segmenter.split_raw(text) if isinstance(g, str)][-2:]


class TestResumedScan:
    """A prompt encoded from where the previous one's scan restarted has a full
    encode's ids: for any texts sharing any prefix, whatever stands at the
    divergence (cut tokens, pieces of them, tokens that run across it)."""

    @pytest.mark.parametrize("name", MODELS)
    @PROPERTY
    @given(common=CONTENT, first=CONTENT, second=CONTENT, parts=st.lists(CONTENT, max_size=4))
    def test_any_shared_prefix(self, loaded, encoders, name, common, first, second, parts):
        model, encoder = loaded[name], fresh(encoders[name])
        prefix = "".join(parts) + common
        one, two = prefix + first, prefix + second
        shared = len(prefix)
        while shared < min(len(one), len(two)) and one[shared] == two[shared]:
            shared += 1
        ids_one, resume = encoder.encode_turn(one)
        assert ids_one == full(model, one)
        ids_two, again = encoder.encode_turn(two, resume, shared)
        assert ids_two == full(model, two)
        assert again is not None and again.ids == ids_two
        # and once more from the second
        three = two + first
        ids_three, _ = encoder.encode_turn(three, again, len(two))
        assert ids_three == full(model, three)
        for ids in (ids_one, ids_two, ids_three):  # their MessagePack, as packb packs them
            assert isinstance(ids, TokenIds) and ids.packed() == msgpack.packb(list(ids))

    @pytest.mark.parametrize("name", MODELS)
    def test_a_conversation_resumes_near_its_end(self, loaded, encoders, name):
        model, encoder = loaded[name], fresh(encoders[name])
        messages: list[dict] = [{"role": "system", "content": "Be brief. " * 30}]
        resume, previous = None, ""
        for k in range(6):
            messages = [*messages, {"role": "user", "content": f"Question {k}? " * 40}]
            text = render(model, messages)
            shared = len(previous) if text.startswith(previous) else 0
            ids, resume = encoder.encode_turn(text, resume, shared)
            assert ids == full(model, text)
            if k > 1:  # the scan restarted past most of the conversation (at the end of
                # an answer at the latest: DeepSeek cuts there first, at its turns after)
                assert resume is not None and resume.points
                margin = encoder.segmenter.longest_raw
                kept = max(p[0] for p in resume.points if p[0] <= shared - margin)
                assert kept > len(previous) // 2
            previous = text
            messages = [*messages, {"role": "assistant", "content": f"Answer {k}. " * 40}]

    def test_a_cut_token_that_runs_across_the_divergence(self, loaded):
        """Cut tokens one of which begins another (``<x>``, ``<x><y>``): where the
        first text ends a match, the second's may run on past the shared part;
        the scan resumes at least the longest cut token before it."""
        from tokenizers import AddedToken, Tokenizer

        backend = Tokenizer.from_str(loaded["chatml"].backend.to_str())
        backend.add_tokens([AddedToken(t, normalized=False) for t in ("<x>", "<x><y>")])
        encoder = IncrementalEncoder.for_tokenizer(backend)
        assert encoder.segmenter is not None, encoder.fallback_reason
        one, two = "question <x>" + "z", "question <x>" + "<y> and more"
        _, resume = encoder.encode_turn(one)
        ids, _ = encoder.encode_turn(two, resume, len("question <x>"))
        assert ids == backend.encode(two, add_special_tokens=False).ids
