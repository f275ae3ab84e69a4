"""The report's score section and score.png from a constructed tally."""

from __future__ import annotations

from pathlib import Path

from shadow_proxy.replay.report import command_footer
from shadow_proxy.replay.score_report import SCORE_PNG, plot, section
from shadow_proxy.replay.scores import ScoreTally
from tests.unit.replay.test_scores import scoring


def tally(records: int) -> ScoreTally:
    t = ScoreTally()
    base = scoring([0.5] * 8, [True] * 8)
    cand = scoring([0.25] * 8, [False] * 4 + [True] * 4)
    for _ in range(records):
        t.add(cand, base, base, greedy=True, exact=(False, True))
    return t


class TestSection:
    def test_table_and_verdict(self) -> None:
        text = "\n".join(section(tally(12).summary()))
        assert "| text: top-1 agreement | 0.5 | 1 | -0.5 | [-0.5, -0.5] | 12 |" in text
        assert "| tool calls: top-1 agreement | - | - | - | - | 0 |" in text
        assert "McNemar exact p = 0.0004883" in text
        assert "**Score verdict: worse**" in text


class TestPlot:
    def test_writes_the_figure(self, tmp_path: Path) -> None:
        assert plot(
            tmp_path, tally(6), "shadow-replay x --score", "no verdict", command_footer
        ) == [SCORE_PNG]
        assert (tmp_path / SCORE_PNG).stat().st_size > 10_000

    def test_nothing_scored_leaves_no_stale_figure(self, tmp_path: Path) -> None:
        (tmp_path / SCORE_PNG).write_bytes(b"old")
        assert plot(tmp_path, ScoreTally(), "c", "no verdict", command_footer) == []
        assert not (tmp_path / SCORE_PNG).exists()
