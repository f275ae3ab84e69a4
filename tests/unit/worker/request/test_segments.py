"""Where cutting a prompt is exact, and where it is refused (the encoder falls back to
full encodes): tiny tokenizers built for each rule of the argument."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from shadow_proxy.worker.request.incremental import IncrementalEncoder
from shadow_proxy.worker.request.segments import Segmenter, literal_regex, probe


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
    segmenter = Segmenter(
        raw=literal_regex(tokens), raw_ids=ids, normalized=None, normalized_ids={}
    )
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
        segmenter = Segmenter(
            raw=literal_regex(["<s>"]), raw_ids={"<s>": 0}, normalized=None, normalized_ids={}
        )
        with pytest.raises(ValueError, match="probe"):
            probe(tokenizer, segmenter)


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
        found = [m.span() for m in literal_regex(tokens).finditer(text)]
        assert found == expected
