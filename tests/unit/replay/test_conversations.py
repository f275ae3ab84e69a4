"""Records grouped into conversations (session id, else prefix chaining), turns
spliced with the candidate's answers, think times as the proxy saw them."""

from __future__ import annotations

from typing import Any

import pytest

from shadow_proxy.replay.conversations import (
    Answer,
    Conversations,
    newest_answer,
    splice,
    think_ns,
)


def record(ids: list[int], session: str | None = None, **request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"request": {"token_ids": ids, **request}}
    if session is not None:
        out["request"]["agent_context"] = {"session_id": session}
    return out


class TestPlace:
    """Each record is a turn of the conversation it continues."""

    def test_prefix_chaining(self):
        c = Conversations()
        first, t0 = c.place(record(list(range(10))))
        other, _ = c.place(record([99, *range(10)]))
        second, t1 = c.place(record(list(range(20))))
        assert (second is first, t0, t1) == (True, 0, 1)
        assert other is not first
        assert c.records == {"prefix": 2, "standalone": 1}

    def test_session_first(self):
        c = Conversations()
        a, _ = c.place(record([1, 2, 3], session="s"))
        b, turn = c.place(record([7, 8], session="s"))
        assert b is a and turn == 1 and a.grouped_by == "session"
        assert c.records == {"session": 2, "standalone": 0}

    def test_identical_first_turns_go_to_the_oldest(self):
        c = Conversations()
        a, _ = c.place(record([1, 2, 3]))
        b, _ = c.place(record([1, 2, 3]))
        assert c.place(record([1, 2, 3, 4]))[0] is a
        assert c.place(record([1, 2, 3, 5]))[0] is b

    def test_bound(self):
        c = Conversations(max_open=2)
        a, _ = c.place(record([1, 1]))
        c.place(record([2, 2]))
        c.place(record([3, 3]))
        assert c.evicted == 1 and c.take_closed() == [a] and c.take_closed() == []
        assert c.place(record([1, 1, 5]))[0] is not a
        assert c.opened == 4

    def test_bound_must_be_positive(self):
        with pytest.raises(ValueError, match="'max_open' must be at least 1"):
            Conversations(0)


def encode(text: str) -> list[int]:
    return [ord(ch) for ch in text]


SPAN = {"message": 1, "start": 2, "end": 5, "before": "<", "after": ">"}


class TestSplice:
    """The primary's answers replaced by the candidate's, or a reason."""

    def test_replaced_in_the_frame(self):
        later = {"message": 3, "start": 6, "end": 7, "before": "", "after": ""}
        ids = [1, 2, 60, 97, 62, 3, 98, 4]
        out = splice(ids, [SPAN, later], [Answer("xy"), Answer("z")], encode)
        assert out == [1, 2, 60, 120, 121, 62, 3, 122, 4]

    @pytest.mark.parametrize(
        ("spans", "answers", "reason"),
        [
            ([SPAN], [], "answers"),
            ([{"start": 2}], [Answer("x")], "no_spans"),
            ([SPAN], [Answer(None)], "candidate_failed"),
            (
                [{"message": 1, "start": 2, "end": 5, "tool_calls": True}],
                [Answer("call b", primary_text="call a")],
                "tool_calls",
            ),
        ],
    )
    def test_reasons(self, spans, answers, reason):
        assert splice([1, 2, 3, 4, 5, 6], spans, answers, encode) == reason

    def test_tool_call_answered_alike_is_kept(self):
        spans = [{"message": 1, "start": 1, "end": 3, "tool_calls": True}]
        answer = Answer("call", token_ids=(5, 6), primary_ids=(5, 6))
        assert splice([1, 2, 3, 4], spans, [answer], encode) == [1, 2, 3, 4]


class TestNewestAnswer:
    """A record's own span and count, when it has them."""

    def test_present(self):
        envelope = record([1], prompt_spans={"assistants": 2, "answers": [SPAN]})
        assert newest_answer(envelope) == (SPAN, 2)

    def test_absent(self):
        assert newest_answer(record([1])) is None
        assert newest_answer(record([1], prompt_spans={"answers": [SPAN]})) is None


class TestThink:
    """The gap between the primary's answer ending and the next turn arriving."""

    def test_gap(self):
        previous = {"arrival_unix_ns": 100, "response": {"end_offset_ns": 50}}
        assert think_ns(previous, {"arrival_unix_ns": 400}) == 250

    def test_never_negative_or_unknown(self):
        previous = {"arrival_unix_ns": 100, "response": {"end_offset_ns": 500}}
        assert think_ns(previous, {"arrival_unix_ns": 400}) == 0
        assert think_ns({"arrival_unix_ns": 100}, {"arrival_unix_ns": 400}) == 0
