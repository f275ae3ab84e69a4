"""Batch completions: one engine request per prompt, as Dynamo 1.6.1 runs them."""

from __future__ import annotations

import json

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.worker.request.batch import PreprocessedBatch, prompts
from shadow_proxy.worker.request.fields import NotMirrored, Reject
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model


@pytest.fixture(scope="module")
def models(model_dirs) -> dict:
    return {name: load_model(name, str(path)) for name, path in model_dirs.items()}


@pytest.fixture(scope="module")
def preprocessor(models) -> Preprocessor:
    return Preprocessor(models)


def preprocess(preprocessor: Preprocessor, body: dict):
    return preprocessor.preprocess(Route.COMPLETIONS, json.dumps(body).encode(), 10**15)


class TestPrompts:
    """Which prompts make a batch."""

    @pytest.mark.parametrize(
        ("prompt", "expected"),
        [
            ("one", None),
            ([1, 2, 3], None),
            (["one"], None),
            ([[1, 2]], None),
            (["a", "b"], ["a", "b"]),
            ([[1], [2, 3]], [[1], [2, 3]]),
            (["a", [2, 3]], ["a", [2, 3]]),
        ],
    )
    def test_batches(self, prompt, expected) -> None:
        assert prompts({"prompt": prompt}) == expected

    def test_other_elements_are_refused(self) -> None:
        with pytest.raises(Reject, match="invalid_field"):
            prompts({"prompt": ["a", {"b": 1}]})


class TestPreprocess:
    """Each prompt is preprocessed as if it had been sent alone."""

    def test_each_prompt_alone(self, preprocessor, models) -> None:
        body = {
            "model": "deepseek",
            "prompt": ["alpha beta", [5, 6, 7], "gamma delta epsilon"],
            "max_tokens": 3,
            "n": 2,
            "temperature": 0.5,
        }
        result = preprocess(preprocessor, body)
        assert isinstance(result, PreprocessedBatch)
        alone = [preprocess(preprocessor, {**body, "prompt": prompt}) for prompt in body["prompt"]]
        assert list(result.requests) == alone
        assert [r.token_ids for r in result.requests] == [
            models["deepseek"].encode("alpha beta"),
            [5, 6, 7],
            models["deepseek"].encode("gamma delta epsilon"),
        ]
        assert {r.sampling_options["n"] for r in result.requests} == {2}

    def test_max_tokens_per_prompt(self, preprocessor) -> None:
        """Each prompt's request carries the batch's max_tokens; omitted, it stays
        unset for every prompt (Dynamo 1.6.1 leaves it to the engine)."""
        body = {"model": "chatml", "prompt": [[1], [1, 2, 3]]}
        result = preprocess(preprocessor, body)
        assert all("max_tokens" not in r.stop_conditions for r in result.requests)
        result = preprocess(preprocessor, {**body, "max_tokens": 7})
        assert [r.stop_conditions["max_tokens"] for r in result.requests] == [7, 7]

    def test_one_bad_prompt_stops_the_batch(self, preprocessor) -> None:
        body = {"model": "chatml", "prompt": [[1], [2**32]]}
        assert preprocess(preprocessor, body) == NotMirrored("invalid_field")
