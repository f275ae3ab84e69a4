"""Incremental tokenization: ids identical to a full encode, on both real tokenizers."""

from __future__ import annotations

import json
import random
import tracemalloc
from array import array
from collections.abc import Callable

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.incremental import (
    IncrementalEncoder,
    SegmentCache,
    Segmenter,
    _literal_regex,
    _probe,
)
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import LoadedModel, load_model

MODELS = ("deepseek", "chatml")
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that stresses the cut points: every special token of both models, pieces of
# them, whitespace of all kinds (at segment edges too), combining marks that NFC
# composes, digits the pre-tokenizers split, CJK, emoji.
FRAGMENTS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "start|>", "<|", "|>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜tool▁output▁begin｜>", "<｜tool▁outputs▁begin｜>", "<｜place▁holder▁no▁1｜>",
    "<｜place▁holder▁no▁10｜>", "<｜table｜>", "<think>", "</think>", "<｜", "｜>", "User｜>",
    "▁", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\u2028", " \n ",
    "e\u0301", "\u0301", "\u0308", "é", "12345", "3.14", "日本語テキスト", "中文", "문장",
    "😀", "🚀✨", "def f(x):\n    return x", "Hello", " world", "!", "'s", "<", ">",
]  # fmt: skip
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
            "Be brief.", "first question", "first answer", "second",
        ]  # fmt: skip

    def test_chatml_cuts_at_im_tokens(self, loaded, encoders):
        model, encoder = loaded["chatml"], encoders["chatml"]
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        pieces = encoder.segmenter.split(render(model, messages))
        assert [p for p in pieces if isinstance(p, str)] == [
            "user\nhi", "\n", "assistant\nyo", "\n", "assistant\n",
        ]  # fmt: skip


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
        ]  # fmt: skip
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


class TestSegmentCache:
    """LRU by bytes; the bound holds as counted and as measured by tracemalloc."""

    def test_least_recently_used_goes_first(self):
        one = SegmentCache.cost("a", array("I", [1]))
        cache = SegmentCache(max_bytes=3 * one, max_entry_bytes=one)
        for key in "abc":
            cache.put(key, array("I", [1]))
        assert cache.get("a") is not None  # a is now the most recent
        cache.put("d", array("I", [1]))
        assert cache.get("b") is None
        assert [cache.get(k) is not None for k in "acd"] == [True, True, True]
        assert cache.size_bytes <= cache.max_bytes
        assert cache.evictions == 1

    def test_oversized_entries_are_not_kept(self):
        cache = SegmentCache(max_bytes=10_000)
        cache.put("x" * 5_000, array("I", range(100)))
        assert len(cache) == 0
        assert cache.size_bytes == 0

    def test_memory_measured_within_bound(self):
        """Entries made and handed over as the encoder does (the cache holds the only
        reference): what tracemalloc sees held stays within ``max_bytes``."""
        max_bytes = 1024 * 1024
        rng = random.Random(7)
        cache = SegmentCache(max_bytes=max_bytes)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(6_000):
                size = rng.choice((1, 8, 60, 400))
                key = "".join(rng.choice("abcdé日😀 \n") for _ in range(size)) + str(i)
                cache.put(key, array("I", range(rng.randint(0, size))))
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert cache.evictions > 0
        assert cache.size_bytes <= max_bytes
        assert held <= max_bytes, (held, cache.size_bytes, len(cache))


def _tiny(pre_tokenizer=None, normalizer=None, model=None) -> Tokenizer:
    """A small BPE trained here, with "<s>" as a special token."""
    tokenizer = Tokenizer(model or models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"], show_progress=False)
    corpus = ["hello world, the quick brown fox", "a b c hello there", "<s> x y z"] * 20
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def _naive(tokenizer: Tokenizer, tokens: list[str], text: str) -> list[int]:
    """Cut at ``tokens`` without any check, as an unchecked segmenter would."""
    ids = {t: tokenizer.token_to_id(t) for t in tokens}
    segmenter = Segmenter(raw=_literal_regex(tokens), raw_ids=ids, normalized=None,
                          normalized_ids={})  # fmt: skip
    out: list[int] = []
    for piece in segmenter.split(text):
        out += [piece] if isinstance(piece, int) else tokenizer.encode(piece).ids
    return out


def _set_special(tokenizer: Tokenizer, **flags) -> None:
    tokenizer.add_special_tokens([AddedToken("<s>", special=True, normalized=False, **flags)])


#: Configurations the check refuses: how to build one, a text it gets wrong when cut,
#: and a word of the reason.
REFUSED = {
    "metaspace-first": (
        lambda: _tiny(pre_tokenizers.Metaspace(prepend_scheme="first")),
        "hello<s>hello",
        "prepend_scheme",
    ),
    "lstrip": (
        lambda: _with(_tiny(pre_tokenizers.ByteLevel()), lstrip=True),
        "a  <s>b",
        "strips",
    ),
    "rstrip": (
        lambda: _with(_tiny(pre_tokenizers.ByteLevel()), rstrip=True),
        "a<s>  b",
        "strips",
    ),
    "single-word": (
        lambda: _with(_tiny(pre_tokenizers.Whitespace()), single_word=True),
        "a<s>b",
        "single words",
    ),
    "encode-special-tokens": (
        lambda: _encode_special(_tiny(pre_tokenizers.Whitespace())),
        "hello<s>there",
        "encode_special_tokens",
    ),
    "truncation": (
        lambda: _truncated(_tiny(pre_tokenizers.Whitespace())),
        "hello world <s> hello world",
        "truncation",
    ),
}


class TestFallbackWhereCuttingIsWrong:
    """Each refused configuration really breaks cutting; the encoder falls back and
    stays exact."""

    @pytest.mark.parametrize("case", REFUSED)
    def test_refused_and_exact(self, case):
        make, text, reason = REFUSED[case]
        tokenizer = make()
        expected = tokenizer.encode(text, add_special_tokens=False).ids
        assert _naive(tokenizer, ["<s>"], text) != expected, "cutting would be right here"
        encoder = IncrementalEncoder.for_tokenizer(tokenizer)
        assert encoder.segmenter is None
        assert reason in encoder.fallback_reason
        assert encoder.encode(text) == expected

    def test_metaspace_always_is_enabled(self):
        tokenizer = _tiny(pre_tokenizers.Metaspace(prepend_scheme="always"))
        encoder = IncrementalEncoder.for_tokenizer(tokenizer)
        assert encoder.fallback_reason is None
        text = "hello<s>hello <s> x"
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids

    def test_bpe_dropout_refused(self):
        tokenizer = _tiny(pre_tokenizers.Whitespace(), model=models.BPE(dropout=0.5))
        assert "dropout" in IncrementalEncoder.for_tokenizer(tokenizer).fallback_reason

    def test_unknown_pre_tokenizer_refused(self):
        tokenizer = _tiny(pre_tokenizers.Sequence([pre_tokenizers.Whitespace()]))
        tokenizer.pre_tokenizer = pre_tokenizers.FixedLength(length=3)
        assert "FixedLength" in IncrementalEncoder.for_tokenizer(tokenizer).fallback_reason

    def test_normalized_tokens_not_cut_under_a_normalizer(self):
        """With NFC, a normalized added token is matched in normalized text: "<e" is
        not in NFC("<e\u0301") = "<\u00e9", so the raw text must not be cut there.
        The segmenter cuts at raw tokens only and leaves the rest to the library."""
        tokenizer = _tiny(pre_tokenizers.ByteLevel(), normalizers.NFC())
        tokenizer.add_tokens([AddedToken("<e", normalized=True)])
        text = "x<e\u0301 <s><e y"
        expected = tokenizer.encode(text, add_special_tokens=False).ids
        assert _naive(tokenizer, ["<s>", "<e"], text) != expected, "cutting would be right"
        encoder = IncrementalEncoder.for_tokenizer(tokenizer)
        assert encoder.fallback_reason is None
        assert encoder.encode(text) == expected

    def test_probe_catches_a_wrong_segmenter(self):
        tokenizer = _tiny(pre_tokenizers.Metaspace(prepend_scheme="first"))
        segmenter = Segmenter(raw=_literal_regex(["<s>"]), raw_ids={"<s>": 0}, normalized=None,
                              normalized_ids={})  # fmt: skip
        with pytest.raises(ValueError, match="probe"):
            _probe(tokenizer, segmenter)


def _with(tokenizer: Tokenizer, **flags) -> Tokenizer:
    _set_special(tokenizer, **flags)
    return tokenizer


def _encode_special(tokenizer: Tokenizer) -> Tokenizer:
    tokenizer.encode_special_tokens = True
    return tokenizer


def _truncated(tokenizer: Tokenizer) -> Tokenizer:
    tokenizer.enable_truncation(max_length=3)
    return tokenizer


class TestLeftmostLongest:
    """The trie regex picks what Aho-Corasick leftmost-longest picks."""

    @settings(max_examples=300, deadline=None)
    @given(
        tokens=st.lists(
            st.text(alphabet="ab<>|", min_size=1, max_size=4), min_size=1, max_size=6, unique=True
        ),
        text=st.text(alphabet="ab<>|c", max_size=30),
    )
    def test_same_matches_as_a_reference_scan(self, tokens, text):
        expected, i = [], 0
        while i < len(text):
            hits = [t for t in tokens if text.startswith(t, i)]
            if hits:
                best = max(hits, key=len)
                expected.append((i, i + len(best)))
                i += len(best)
            else:
                i += 1
        found = [m.span() for m in _literal_regex(tokens).finditer(text)]
        assert found == expected
