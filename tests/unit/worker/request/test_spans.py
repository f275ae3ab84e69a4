"""Answer spans: a new answer rendered in the frame gives the frontend's own ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model
from tests.support.requests import MODELS

ENGINES = ("minijinja", "jinja2")


@pytest.fixture(scope="module")
def preprocessors(model_dirs: dict[str, Path]) -> dict[str, Preprocessor]:
    return {
        engine: Preprocessor(
            {
                name: load_model(name, str(model_dirs[name]), None, template_engine=engine)
                for name in MODELS
            }
        )
        for engine in ENGINES
    }


def conversation(*answers: str) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You are terse."}]
    for k, answer in enumerate(answers):
        messages += [
            {"role": "user", "content": f"question {k}?"},
            {"role": "assistant", "content": answer},
        ]
    return [*messages, {"role": "user", "content": f"question {len(answers)}?"}]


def preprocess(pre: Preprocessor, model: str, messages: list[dict]) -> PreprocessedRequest:
    body = json.dumps({"model": model, "messages": messages}).encode()
    result = pre.preprocess(Route.CHAT, body, 0)
    assert isinstance(result, PreprocessedRequest), result
    return result


class TestSplice:
    """The newest answer's span, re-encoded with another text in its frame, is
    the prompt the frontend builds for the conversation holding that text; the
    earlier answer sits where the earlier turn's record placed it."""

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("model", MODELS)
    def test_every_answer_replaced(self, preprocessors, engine, model):
        pre = preprocessors[engine]
        earlier = preprocess(pre, model, conversation("Four."))
        recorded = preprocess(pre, model, conversation("Four.", "Yes, it is 4 indeed."))
        wanted = preprocess(pre, model, conversation("It is 4!", "No."))
        assert recorded.token_ids[: len(earlier.token_ids)] == earlier.token_ids
        encode = pre._models[model].encode
        ids = list(recorded.token_ids)
        spans = [earlier.prompt_spans["answers"][0], recorded.prompt_spans["answers"][0]]
        for answer, text in reversed(list(zip(spans, ("It is 4!", "No."), strict=True))):
            frame = answer["before"] + text + answer["after"]
            ids[answer["start"] : answer["end"]] = encode(frame)
        assert ids == wanted.token_ids

    @pytest.mark.parametrize("engine", ENGINES)
    def test_the_newest_answer_and_the_count(self, preprocessors, engine):
        spans = preprocess(preprocessors[engine], "chatml", conversation("a", "b")).prompt_spans
        assert [a["message"] for a in spans["answers"]] == [4]
        assert spans["assistants"] == 2


class TestWithout:
    """Requests without answers, or whose answers cannot be placed, carry no spans."""

    @pytest.mark.parametrize("model", MODELS)
    def test_first_turn(self, preprocessors, model):
        assert preprocess(preprocessors["minijinja"], model, conversation()).prompt_spans is None

    def test_content_parts(self, preprocessors):
        messages = conversation("x")
        messages[2]["content"] = [{"type": "text", "text": "x"}]
        assert preprocess(preprocessors["jinja2"], "chatml", messages).prompt_spans is None

    def test_tool_call_answer_has_no_frame(self, preprocessors):
        messages = conversation("")
        messages[2]["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ]
        messages.insert(3, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
        spans = preprocess(preprocessors["minijinja"], "chatml", messages).prompt_spans
        assert spans is not None
        (answer,) = spans["answers"]
        assert answer["tool_calls"] is True
        assert "before" not in answer


CORPUS = Path(__file__).parents[3] / "data" / "fidelity" / "corpus.jsonl"


class TestCorpus:
    """Over the fidelity corpus (split on "\\n": its strings hold U+2028): every
    chat case with spans splices its newest answer exactly; only answers given as
    parts go without."""

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("model", MODELS)
    def test_every_case(self, preprocessors, engine, model):
        pre = preprocessors[engine]
        without = []
        for line in CORPUS.read_text().split("\n"):
            if not line:
                continue
            case = json.loads(line)
            messages = case["body"].get("messages") or []
            if case["api"] != "chat" or not any(m.get("role") == "assistant" for m in messages):
                continue
            body = {**case["body"], "model": model}
            result = pre.preprocess(Route.CHAT, json.dumps(body).encode(), 0)
            assert isinstance(result, PreprocessedRequest), case["name"]
            if not result.prompt_spans:
                without.append(case["name"])
                continue
            ids, changed = list(result.token_ids), [dict(m) for m in messages]
            (answer,) = result.prompt_spans["answers"]
            if "before" in answer:
                text = f"Another answer {answer['message']}."
                frame = answer["before"] + text + answer["after"]
                ids[answer["start"] : answer["end"]] = pre._models[model].encode(frame)
                changed[answer["message"]]["content"] = text
            wanted = pre.preprocess(
                Route.CHAT, json.dumps({**body, "messages": changed}).encode(), 0
            )
            assert ids == wanted.token_ids, case["name"]
        assert without == ["assistant_parts", "assistant_refusal_part"]
