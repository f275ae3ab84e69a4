"""``demo --isl`` counts the model's tokens, not words (issue 17 item 13): the
load generator's prompt is sized with the tokenizer's tokens per word."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from shadow_proxy.devtools.loadgen import LoadSpec, make_body, tokens_per_word_of


@pytest.mark.parametrize("model", ["deepseek", "chatml"])
@pytest.mark.parametrize("isl", [128, 512, 2048])
def test_prompt_has_about_isl_tokens(model_dirs, model, isl):
    path = str(model_dirs[model] / "tokenizer.json")
    spec = LoadSpec(
        url="http://x", model=model, prompt_tokens=isl, tokens_per_word=tokens_per_word_of(path)
    )
    prompt = json.loads(make_body(spec, 3))["messages"][0]["content"]
    tokens = len(Tokenizer.from_file(path).encode(prompt, add_special_tokens=False).ids)
    # "About": random words vary in length; the chat template adds a few tokens.
    assert isl * 0.93 <= tokens <= isl * 1.05, (model, isl, tokens)
