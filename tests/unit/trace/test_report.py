"""The reuse report for people: the terminal table (one line per scope and block
size, all models first) and the PNG plot naming its command."""

from __future__ import annotations

import numpy as np

from shadow_proxy.trace import report
from shadow_proxy.trace.reuse import ALL, ReuseCurve


def curve(block: int, requests: int, prompt_tokens: int, hist: list[int]) -> ReuseCurve:
    return ReuseCurve(block, requests, prompt_tokens, np.array(hist, np.int64))


RESULT = {
    "zeta": {16: curve(16, 1, 32, [2, 0])},
    ALL: {16: curve(16, 3, 64, [2, 1, 1]), 64: curve(64, 3, 64, [1, 0])},
    "a-model-with-a-very-long-name-indeed": {16: curve(16, 2, 32, [0, 1, 1])},
}


class TestTable:
    """One line per scope and block size; ``(all)`` first, then models by name."""

    def test_lines(self) -> None:
        lines = report.table(RESULT).splitlines()
        assert lines[0].split()[:5] == ["model", "B", "requests", "prompt", "tok"]
        assert set(lines[1]) == {"-"} and len(lines[1]) == len(lines[0])
        rows = [line.split() for line in lines[2:-2]]
        assert [r[:2] for r in rows] == [
            ["(all)", "16"],
            ["(all)", "64"],
            ["a-model-with-a-very-lon…", "16"],
            ["zeta", "16"],
        ]
        assert rows[0][2:] == ["3", "64", "50.0%", "1", "2", "2"]
        assert rows[1][2:] == ["3", "64", "0.0%", "-", "-", "-"]
        assert lines[-2].startswith("hit inf:") and lines[-1].startswith("pN blk:")

    def test_fits_100_columns(self) -> None:
        assert max(len(line) for line in report.table(RESULT).splitlines()) <= 100

    def test_thousands_separated(self) -> None:
        big = {ALL: {16: curve(16, 12345, 1_234_560, [77160])}}
        assert "12,345" in report.table(big) and "1,234,560" in report.table(big)


class TestPlot:
    """A PNG, with the command in its title."""

    def test_png_written(self, tmp_path) -> None:
        path = tmp_path / "reuse.png"
        report.plot(RESULT, path, "shadow-trace analyze x " + "y" * 300)
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    def test_empty_result(self, tmp_path) -> None:
        path = tmp_path / "empty.png"
        report.plot({ALL: {16: curve(16, 0, 0, [0])}}, path, "shadow-trace analyze")
        assert path.read_bytes()[:4] == b"\x89PNG"


NO_REUSE = {ALL: {16: curve(16, 3, 64, [0]), 64: curve(64, 3, 64, [0])}}


class TestNoReuse:
    """Traffic whose prompts share no whole block: the table and the plot say so
    instead of showing empty curves over a meaningless range."""

    def test_table_says_so(self) -> None:
        lines = report.table(NO_REUSE).splitlines()
        assert lines[-1].startswith("no prefix reuse at block sizes 16, 64")
        assert "no prefix reuse" not in report.table(RESULT)

    def test_note_only_without_reuse(self) -> None:
        assert report.no_reuse(NO_REUSE[ALL]) is not None
        assert report.no_reuse(RESULT[ALL]) is None
        assert report.no_reuse({}) is None
        one = report.no_reuse({512: curve(512, 3, 64, [0])})
        assert one is not None and one.startswith("no prefix reuse at block size 512:")

    def test_plot_says_so(self, tmp_path, monkeypatch) -> None:
        """Each axis carries the note (the figure is caught as it is saved)."""
        from matplotlib.figure import Figure

        saved: list[Figure] = []
        save = Figure.savefig

        def keep(fig: Figure, *args, **kwargs) -> None:
            saved.append(fig)
            save(fig, *args, **kwargs)

        monkeypatch.setattr(Figure, "savefig", keep)
        path = tmp_path / "none.png"
        report.plot(NO_REUSE, path, "shadow-trace analyze")
        assert path.read_bytes()[:4] == b"\x89PNG"
        (fig,) = saved
        notes = [[t.get_text() for t in axis.texts] for axis in fig.axes]
        assert len(notes) == 2
        assert all(len(n) == 1 and n[0].startswith("no prefix reuse at block sizes") for n in notes)
        saved.clear()
        report.plot(RESULT, tmp_path / "reuse.png", "shadow-trace analyze")
        assert not any(axis.texts for axis in saved[0].axes)
