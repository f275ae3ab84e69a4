"""Per-choice output within its memory caps: text and ids cut, counting goes on."""

from __future__ import annotations

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
