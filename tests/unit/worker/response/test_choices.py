"""Per-choice output within its memory caps: text and ids cut, counting goes on."""

from __future__ import annotations

from shadow_proxy.worker.response.choices import ChoiceTable
from tests.support.responses import chat, observe, record, sse


class TestCapsThroughTheRecorder:
    """A stream past a cap keeps counting; what is kept stops at the cap."""

    def test_text_cap_keeps_counting(self) -> None:
        body = sse(*(chat("ééé") for _ in range(10)), chat(finish="stop"))
        obs = observe(body, max_text_bytes_per_choice=15)
        choice = obs.choices[0]
        assert choice.text == "é" * 7  # cut at a character boundary, not mid-character
        assert choice.text_truncated
        assert choice.content_chunks == 10
        rec = record(obs)
        assert rec["choices"][0]["text_truncated"] is True
        assert rec["choices"][0]["truncated"] is True
        assert rec["choices"][0]["output_tokens"] == 10  # at least the content chunks

    def test_total_text_cap_over_choices(self) -> None:
        body = sse(*(chat("abcd", index=i % 2) for i in range(10)))
        obs = observe(body, n=2, max_text_bytes_total=10)
        assert [c.text for c in obs.choices] == ["abcdab", "abcd"]
        assert [c.text_truncated for c in obs.choices] == [True, True]

    def test_choice_index_cap(self) -> None:
        body = sse(*(chat("a", index=i, finish="stop") for i in range(6)), chat("b", index="x"))
        obs = observe(body, max_choices=4)
        assert [c.index for c in obs.choices] == [0, 1, 2, 3]
        assert obs.ignored_choices == 3


def table(**caps: int) -> ChoiceTable:
    limits = {
        "max_text_bytes_per_choice": 8,
        "max_text_bytes_total": 12,
        "max_token_ids_per_choice": 3,
        "max_token_ids_total": 5,
        "max_choices": 2,
        **caps,
    }
    return ChoiceTable(**limits)


class TestChoiceTable:
    """Called directly: each cap cuts what is kept, never what is counted."""

    def test_indices(self) -> None:
        t = table()
        assert t.get(0) is t.get(0) and t.get(1) is not None
        assert t.get(2) is None  # over max_choices
        assert t.get(-1) is None and t.get("0") is None and t.get(True) is None
        assert t.ignored == 4
        assert [c.index for c in t.observed()] == [0, 1]

    def test_text_cut_at_a_character_boundary(self) -> None:
        t = table()
        choice = t.get(0)
        t.add_text(choice, "abcdefg")  # 7 bytes of 8
        t.add_text(choice, "é")  # 2 bytes, 1 of room: half a character is not kept
        t.add_text(choice, "h")  # truncated: nothing more kept, even what would fit
        [observed] = t.observed()
        assert observed.text == "abcdefg" and observed.text_truncated
        assert t.text_total == 7

    def test_total_text_cap_over_choices(self) -> None:
        t = table()
        t.add_text(t.get(0), "12345678")
        t.add_text(t.get(1), "abcdefgh")
        assert [c.text for c in t.observed()] == ["12345678", "abcd"]

    def test_ids_kept_up_to_the_caps_and_all_counted(self) -> None:
        t = table()
        first, second = t.get(0), t.get(1)
        assert t.add_ids(first, [1, 2, 3, 4])
        assert t.add_ids(second, [5, 6, 7])
        a, b = t.observed()
        assert (list(a.upstream_token_ids), a.upstream_token_count) == ([1, 2, 3], 4)
        assert (list(b.upstream_token_ids), b.upstream_token_count) == ([5, 6], 3)

    def test_ids_that_are_not_ids_are_refused_whole(self) -> None:
        t = table()
        choice = t.get(0)
        assert t.add_ids(choice, [1])
        assert not t.add_ids(choice, [2, "x"])
        assert not t.add_ids(choice, [-1])
        assert list(t.observed()[0].upstream_token_ids) == [1] and t.ids_total == 1

    def test_finish_reasons_and_clear(self) -> None:
        t = table()
        t.get(1).finish_reason = "stop"
        t.get(0)
        assert t.finish_reasons() == [(0, None), (1, "stop")]
        t.clear()
        assert t.observed() == ()
