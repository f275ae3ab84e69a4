"""The previous turn's prompt places the next turn's answer as the renders would: the
same records with and without the cache, over multi-turn conversations and
content-reading templates, on both template engines; bounded; keyed by the
conversation and what the template is given."""

from __future__ import annotations

import json

import attrs
import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.worker.request import prompt
from shadow_proxy.worker.request.incremental import IncrementalEncoder, Resume, TokenIds
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import LoadedModel, load_model
from shadow_proxy.worker.request.turn_cache import Frames, TurnCache, context_key
from tests.support.requests import MODELS

ENGINES = ("minijinja", "jinja2")
#: The conversation's session header: its turns come to one shard (only then kept).
SESSION = [("x-dynamo-session-id", "conversation-1")]
LONG = "An answer, with <b>markup</b>, \u00e9, \U0001f600 and a \\ or two. " * 4


def conversation(turns: int, system: bool = True) -> list[list[dict]]:
    """The message lists of each turn of one conversation."""
    messages: list[dict] = [{"role": "system", "content": "Be brief. " * 8}] if system else []
    out = []
    for k in range(turns):
        messages = [*messages, {"role": "user", "content": f"Question {k}: " + "why? " * 12}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"{k}. {LONG}"}]
    return out


def with_encoder(model: LoadedModel) -> LoadedModel:
    """As the worker sets a model up (``worker/shard/models.py``)."""
    encoder = IncrementalEncoder.for_tokenizer(model.backend)
    encoder.learn_answer_gap(model.chat_template.render)
    return attrs.evolve(model, prompt_encoder=encoder)


def preprocessors(model_dirs, name: str, engine: str = "minijinja") -> tuple[Preprocessor, ...]:
    """With the cache, and without it (the renders place every answer; each prompt
    is scanned from its start)."""
    model = with_encoder(load_model(name, str(model_dirs[name]), None, template_engine=engine))
    cached = attrs.evolve(model, turns=TurnCache())
    return Preprocessor({name: cached}), Preprocessor({name: model}), cached.turns


def only_the_cache(monkeypatch) -> None:
    """No renders to fall back on: an answer the cache cannot place has no spans."""
    monkeypatch.setattr(prompt, "_held_renders", lambda *args: None)
    monkeypatch.setattr(prompt, "answer_spans", lambda *args: None)


class TestSameRecords:
    """Each turn's record is the one the renders give; the cache placed them."""

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("model_name", MODELS)
    def test_conversations(self, model_dirs, model_name, engine, monkeypatch):
        cached, plain, turns = preprocessors(model_dirs, model_name, engine)
        bodies = [
            json.dumps({"model": model_name, "messages": messages, "max_tokens": 4 + k}).encode()
            for system in (True, False)
            for k, messages in enumerate(conversation(4, system))
        ]
        want = [plain.preprocess(Route.CHAT, body, 0, SESSION) for body in bodies]
        only_the_cache(monkeypatch)
        got = [cached.preprocess(Route.CHAT, body, 0, SESSION) for body in bodies]
        assert got == want
        placed = sum(1 for r in got if getattr(r, "prompt_spans", None))
        assert placed == 6  # every turn but the first of each conversation
        assert turns.hits == 6

    @pytest.mark.parametrize("reads", ["trim", "split", "length"])
    def test_a_template_that_reads_the_content(self, model_dirs, tmp_path, reads):
        """Templates that trim, cut or decide on a content: whatever the cache
        places, the renders would place the same (or nothing)."""
        from tests.unit.worker.request.test_prompt import reading_model

        model = with_encoder(load_model("m", str(reading_model(model_dirs, tmp_path, reads))))
        cached = Preprocessor({"m": attrs.evolve(model, turns=TurnCache())})
        plain = Preprocessor({"m": model})
        for answer in ("  spaced " * 10, "<think>hm</think>" + "said " * 20, "plain " * 20):
            messages: list[dict] = []
            for k in range(3):
                messages = [*messages, {"role": "user", "content": f" q{k} " * 20}]
                body = json.dumps({"model": "m", "messages": messages}).encode()
                assert cached.preprocess(Route.CHAT, body, 0, SESSION) == plain.preprocess(
                    Route.CHAT, body, 0, SESSION
                ), (reads, answer, k)
                messages = [*messages, {"role": "assistant", "content": answer}]


class TestTruth:
    """Where a template rewrites or decides on a content, an answer placed (by the
    cache or the renders) holds that answer as it was sent (the ids of its frame
    and content), and a new answer the template renders as it is splices into
    the ids of the changed conversation. The checks on the prompt's text refuse
    the rest."""

    @pytest.mark.parametrize("reads", ["trim", "split", "length", "upper", "replace"])
    def test_splice(self, model_dirs, tmp_path, reads):
        from tests.unit.worker.request.test_prompt import reading_model

        model = with_encoder(load_model("m", str(reading_model(model_dirs, tmp_path, reads))))
        cached = Preprocessor({"m": attrs.evolve(model, turns=TurnCache())})
        answers = ("  spaced " * 10, "<think>hm</think>" + "said " * 20, "plain " * 20 + "end")
        light = 0
        for answer in answers:
            messages: list[dict] = []
            for k in range(3):
                messages = [*messages, {"role": "user", "content": f" q{k} " * 20}]
                body = {"model": "m", "messages": messages}
                got = cached.preprocess(Route.CHAT, json.dumps(body).encode(), 0, SESSION)
                for placed in (got.prompt_spans or {}).get("answers", []):  # type: ignore[union-attr]
                    ids = list(got.token_ids)  # type: ignore[union-attr]
                    before, after = placed["before"], placed["after"]
                    held = ids[placed["start"] : placed["end"]]
                    assert held == model.encode(before + answer + after), (reads, answer, k)
                    new = "another answer"  # every template here renders it as it is
                    ids[placed["start"] : placed["end"]] = model.encode(before + new + after)
                    changed = [dict(m) for m in messages]
                    changed[placed["message"]]["content"] = new
                    want = Preprocessor({"m": model}).preprocess(
                        Route.CHAT, json.dumps({**body, "messages": changed}).encode(), 0
                    )
                    assert ids == want.token_ids, (reads, answer, k)  # type: ignore[union-attr]
                    light += 1
                messages = [*messages, {"role": "assistant", "content": answer}]
        # content-reading answers are refused, the rest placed
        assert light == {"trim": 2, "split": 4, "replace": 4}.get(reads, 0), light


class TestSessions:
    """Only a request that names its session (its next turn comes to this shard)
    is kept: single requests cost the cache nothing."""

    def test_without_a_session(self, model_dirs, monkeypatch):
        cached, _, turns = preprocessors(model_dirs, "chatml")
        for messages in conversation(3):
            body = json.dumps({"model": "chatml", "messages": messages}).encode()
            cached.preprocess(Route.CHAT, body, 0)
        assert turns.size_bytes == 0 and turns.hits == 0
        for messages in conversation(3):
            body = json.dumps({"model": "chatml", "messages": messages}).encode()
            cached.preprocess(Route.CHAT, body, 0, SESSION)
        assert turns.size_bytes > 0 and turns.hits == 2


class TestKeys:
    """A turn is found only by the same messages in the same request context."""

    def test_other_messages_or_context(self, model_dirs, monkeypatch):
        cached, _, turns = preprocessors(model_dirs, "chatml")
        only_the_cache(monkeypatch)
        first, second = conversation(2)
        body = {"model": "chatml", "messages": first}
        cached.preprocess(Route.CHAT, json.dumps(body).encode(), 0, SESSION)
        edited = [{**second[0], "content": "Be long."}, *second[1:]]  # an earlier message changed
        for messages, extra in ((edited, {}), (second, {"chat_template_kwargs": {"x": 1}})):
            got = cached.preprocess(
                Route.CHAT, json.dumps({**body, "messages": messages, **extra}).encode(), 0, SESSION
            )
            assert got.prompt_spans is None  # type: ignore[union-attr]
        assert turns.hits == 0
        got = cached.preprocess(
            Route.CHAT, json.dumps({**body, "messages": second}).encode(), 0, SESSION
        )
        assert got.prompt_spans is not None  # type: ignore[union-attr]
        assert turns.hits == 1

    def test_context_key(self):
        assert context_key({"model": "m", "messages": [], "max_tokens": 3, "stream": True}) == ""
        assert context_key({"tools": [{"a": 1}]}) != context_key({"tools": [{"a": 2}]})


class TestBound:
    """At most ``max_bytes`` of prompts (and their ids), least recently used out."""

    def test_eviction(self):
        turns = TurnCache(max_bytes=60_000)
        frames = turns.frames(lambda request: "x" if request["add_generation_prompt"] else "", {})
        assert frames is None  # a template that renders no turn: nothing learned
        frames = Frames("<gen>", "<gen>", "</a>")
        texts = [f"turn {k} " + "." * 2_000 + "<gen>" for k in range(20)]
        for k, text in enumerate(texts):
            resume = Resume(TokenIds(range(300)), [(5, 1, 1)])
            turns.remember({}, [{"role": "user", "content": f"u{k}"}], text, frames, resume)
            assert turns.size_bytes <= turns.max_bytes
        assert len(turns._turns) < 20

        def found(k: int) -> int:
            messages = [{"role": "user", "content": f"u{k}"}, {"role": "assistant"}]
            return turns.head({}, messages, 1, texts[k] + "answer</a>", frames)[0]

        assert found(19) == len(texts[19]) - len("<gen>")
        assert found(0) == 0
        more = Resume(TokenIds([1, 2]), [])
        assert TurnCache.cost("x", more) > TurnCache.cost("x", Resume(TokenIds(), []))

    def test_no_generation_prompt_is_not_kept(self):
        turns = TurnCache()
        messages = [{"role": "user", "content": "u"}]
        frames, resume = Frames("<gen>", "", ""), Resume(TokenIds(), [])
        turns.remember({"add_generation_prompt": False}, messages, "p<gen>", frames, resume)
        turns.remember({}, messages, "p without it", frames, resume)
        assert turns.size_bytes == 0
