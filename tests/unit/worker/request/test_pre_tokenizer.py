"""DeepSeek's three pre-tokenizer splits run as one: the same pieces and ids as written."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from shadow_proxy.worker.request import pre_tokenizer
from shadow_proxy.worker.request.pre_tokenizer import (
    APPLIED,
    MERGED,
    REPRESENTATIVES,
    deepseek_splits,
    faster_pre_tokenizer,
)
from shadow_proxy.worker.request.tokenizer import load_model


@pytest.fixture(scope="module")
def both(model_dirs) -> tuple[Tokenizer, Tokenizer]:
    """DeepSeek's tokenizer as written, and with the splits as one."""
    path = str(model_dirs["deepseek"] / "tokenizer.json")
    written, merged = Tokenizer.from_file(path), Tokenizer.from_file(path)
    assert faster_pre_tokenizer(merged) == APPLIED
    return written, merged


def differing(both: tuple[Tokenizer, Tokenizer], texts) -> list[str]:
    written, merged = (t.pre_tokenizer for t in both)
    return [t for t in texts if merged.pre_tokenize_str(t) != written.pre_tokenize_str(t)]


def test_every_pair_of_representatives_cuts_alike(both):
    pairs = ("".join(p) for p in itertools.product(REPRESENTATIVES, repeat=2))
    assert differing(both, pairs) == []


def test_random_triples_and_longer_runs_cut_alike(both):
    # Every ordered triple passed once (405,224 of them, 6 s): a sample here.
    rng = random.Random(7)
    texts = ["".join(rng.choices(REPRESENTATIVES, k=rng.choice((3, 5, 12)))) for _ in range(20_000)]
    assert differing(both, texts) == []


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(REPRESENTATIVES) | st.characters(exclude_categories=["Cs"])))
def test_any_text_cuts_alike(both, text):
    assert differing(both, [text]) == []


def test_answers_and_prompts_encode_to_the_same_ids(both):
    written, merged = both
    rng = random.Random(34)
    # Answers as the mocker streams them: random tokens, decoded.
    texts = [
        "".join(written.decode([rng.randrange(1000, 100_000)]) for _ in range(300))
        for _ in range(20)
    ]
    texts.append(
        "<｜begin▁of▁sentence｜>You help.<｜User｜>1234567 円 ・ｱ 東京  \n\n x<｜Assistant｜>"
    )
    for text in texts:
        want = written.encode_batch_fast([text], add_special_tokens=False)[0].ids
        assert merged.encode_batch_fast([text], add_special_tokens=False)[0].ids == want


def test_load_model_runs_deepseek_splits_as_one(model_dirs):
    backend = load_model("deepseek", str(model_dirs["deepseek"])).backend
    assert deepseek_splits(backend) is None  # no longer the three
    split, byte_level = json.loads(backend.pre_tokenizer.__getstate__())["pretokenizers"]
    assert split["pattern"] == {"Regex": MERGED}
    assert byte_level["type"] == "ByteLevel"


def test_other_pre_tokenizers_are_left_as_written(model_dirs):
    tokenizer = Tokenizer.from_file(str(model_dirs["chatml"] / "tokenizer.json"))
    before = tokenizer.pre_tokenizer.__getstate__()
    assert faster_pre_tokenizer(tokenizer) is None
    assert tokenizer.pre_tokenizer.__getstate__() == before


@pytest.mark.parametrize(
    "wrong",
    [
        # letters that run on into CJK (split 2 cuts them off)
        lambda m: m.replace("\\p{L}\\p{M}&&[^", "\\p{L}\\p{M}&&[^a"),
        # no gap of its own in a CJK run: it joins the gap beside it
        lambda m: m[: m.index("|(?:")] + m[m.index("|[!") :],
        # a space before a number read as before a non-space
        lambda m: m.replace("(?![^\\s\\p{N}", "(?![^\\s"),
    ],
)
def test_a_pattern_that_cuts_otherwise_is_not_used(model_dirs, monkeypatch, wrong):
    monkeypatch.setattr(pre_tokenizer, "MERGED", wrong(MERGED))
    assert pre_tokenizer.MERGED != MERGED
    tokenizer = Tokenizer.from_file(str(model_dirs["deepseek"] / "tokenizer.json"))
    before = tokenizer.pre_tokenizer.__getstate__()
    assert faster_pre_tokenizer(tokenizer).startswith("DeepSeek's three splits kept")
    assert tokenizer.pre_tokenizer.__getstate__() == before


def test_load_model_warns_when_the_splits_are_kept(model_dirs, monkeypatch, caplog):
    monkeypatch.setattr(pre_tokenizer, "MERGED", MERGED.replace("(?![^\\s\\p{N}", "(?![^\\s"))
    with caplog.at_level("INFO"):
        backend = load_model("deepseek", str(model_dirs["deepseek"])).backend
    assert deepseek_splits(backend) is not None  # as written
    (record,) = [r for r in caplog.records if "three splits" in r.getMessage()]
    assert record.levelname == "WARNING" and "kept" in record.getMessage()
