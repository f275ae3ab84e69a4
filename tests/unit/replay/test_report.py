"""The replay's files: a pair line flushed as each request finishes, and at the
end summary.json (atomically), report.md and the two plots, from a known tally."""

from __future__ import annotations

import json
from pathlib import Path

from shadow_proxy.replay import report
from shadow_proxy.replay.compare import compare
from shadow_proxy.replay.stats import Tally
from tests.support.replay import observation

RUN = {"candidate": "http://c", "baseline": None, "finished": "2026-01-01T00:00:00+00:00"}


def tally(*, baseline: bool = False, divergent: int = 3, pairs: int = 10) -> Tally:
    """``pairs`` pairs, the first ``divergent`` of which differ in output at token 1."""
    t = Tally(has_baseline=baseline)
    t.skip("no_response")
    for k in range(pairs):
        primary = observation(100.0 + k)
        candidate = observation(200.0 + k, ids=(1, 3) if k < divergent else (1, 2))
        if baseline:
            base = observation(100.0 + k)
            t.add(
                primary, candidate, compare(primary, candidate, 5), base, compare(primary, base, 5)
            )
        else:
            t.add(primary, candidate, compare(primary, candidate, 5))
    return t


class TestPairs:
    """One JSON line per pair, readable before the file is closed."""

    def test_flushed_per_line(self, tmp_path: Path) -> None:
        writer = report.PairsWriter(tmp_path / "out")
        writer.write({"request_id": "a", "n": 1})
        assert (tmp_path / "out" / report.PAIRS).read_text() == '{"request_id":"a","n":1}\n'
        writer.write({"request_id": "b"})
        writer.close()
        writer.write({"request_id": "late"})  # after close: ignored
        lines = (tmp_path / "out" / report.PAIRS).read_text().splitlines()
        assert [json.loads(line)["request_id"] for line in lines] == ["a", "b"]


class TestReport:
    """summary.json holds the tally and the run; report.md says what was done."""

    def test_files(self, tmp_path: Path) -> None:
        summary = report.write_report(tmp_path / "out", tally(), RUN, "shadow-replay x")
        out = tmp_path / "out"
        assert json.loads((out / report.SUMMARY).read_text()) == summary
        assert summary["run"] == RUN and summary["replayed"] == 10
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [report.SUMMARY, report.REPORT, report.LATENCY_PNG, report.DIVERGENCE_PNG]
        )  # no temporary file left behind
        for name in (report.LATENCY_PNG, report.DIVERGENCE_PNG):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_markdown_without_baseline(self, tmp_path: Path) -> None:
        report.write_report(tmp_path, tally(), RUN, "shadow-replay x")
        text = (tmp_path / report.REPORT).read_text()
        assert "Command: `shadow-replay x`" in text
        assert "Candidate: http://c\n" in text and "baseline" not in text.split("\n")[4]
        assert "| skipped | no_response 1 |" in text
        assert "| exact match rate | 0.7 |" in text
        assert "| output | 3 | 0 | 3 |" in text
        assert "no baseline: every difference counts" in text
        assert "| candidate/primary p50 | 95% CI | pairs | verdict |" in text
        assert f"![{report.LATENCY_PNG}]({report.LATENCY_PNG})" in text
        assert "interrupted" not in text

    def test_markdown_with_baseline_and_interrupted(self, tmp_path: Path) -> None:
        run = {**RUN, "baseline": "http://b", "complete": False, "unreadable": {"entry": 2}}
        report.write_report(tmp_path, tally(baseline=True), run, "shadow-replay x")
        text = (tmp_path / report.REPORT).read_text()
        assert "Candidate: http://c; baseline: http://b" in text
        assert "(interrupted: what was done)" in text
        assert "| unreadable | entry 2 |" in text
        assert "| baseline errors | 0 |" in text
        assert "baseline/primary p50 [95% CI]" in text
        assert "| candidate/baseline p50 | 95% CI | pairs | verdict |" in text
        # The candidate/primary ratio is not beside the candidate/baseline verdict.
        assert "candidate/primary" not in text
        assert "counted = the candidate differs and the baseline does not" in text

    def test_nothing_replayed(self, tmp_path: Path) -> None:
        """No blank plots: the report says what there was, and no figure is left."""
        (tmp_path / report.LATENCY_PNG).write_bytes(b"an earlier run's")
        summary = report.write_report(tmp_path, Tally(has_baseline=False), RUN, "x")
        assert summary["replayed"] == 0
        assert "| exact match rate | - |" in (tmp_path / report.REPORT).read_text()
        assert not (tmp_path / report.LATENCY_PNG).exists()
        assert not (tmp_path / report.DIVERGENCE_PNG).exists()


class TestVerdictShown:
    """The table shows the ratio the verdict judged, with its interval, its n and the
    reference it names; the reason below says why."""

    def test_judged_ratio(self, tmp_path: Path) -> None:
        summary = report.write_report(tmp_path, tally(baseline=True), RUN_B, "x")
        text = (tmp_path / report.REPORT).read_text()
        judged = summary["ttft_ms"]["judged"]
        lo, hi = judged["ci95"]
        row = next(line for line in text.splitlines() if line.startswith("| ttft_ms |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[-4:] == [
            f"{judged['ratio_p50']:.4g}",
            f"[{lo:.4g}, {hi:.4g}]",
            str(judged["n"]),
            summary["ttft_ms"]["verdict"],
        ]
        assert judged["ratio_p50"] == summary["ttft_ms"]["candidate_vs_baseline_p50"]
        assert f"- ttft_ms: {judged['reason']}" in text
        assert "(100.0 records)" not in text and "(10 records)" not in text

    def test_errors_section(self, tmp_path: Path) -> None:
        t = Tally()
        for k in range(12):
            p = observation(100.0)
            c = observation(1.0, error=f"overloaded {k % 2}")
            t.add(p, c, compare(p, c, 5))
        summary = report.write_report(tmp_path, t, RUN, "x")
        text = (tmp_path / report.REPORT).read_text()
        assert "| candidate errors | 12 (503 x12) |" in text
        assert "| candidate | 503 | 12 |" in text
        assert "- candidate, 503: `overloaded 0`" in text and "`overloaded 1`" in text
        assert "| not compared: a side failed / no common basis | 12 / 0 |" in text
        assert "no verdict: 12 of 12 candidate requests failed" in text
        assert summary["ttft_ms"]["verdict"] == "no_verdict"


RUN_B = {**RUN, "baseline": "http://b"}


class TestPlots:
    """The footer fits the figure; candidate and baseline bars stand side by side."""

    def test_footer_fits(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        command = "shadow-replay " + " ".join(f"--option-{k} value-{k}" for k in range(40))
        for width in (8, 15):
            fig = plt.figure(figsize=(width, 4.8))
            report.command_footer(fig, command)
            fig.canvas.draw()
            [text] = fig.texts
            box = text.get_window_extent()
            assert box.x1 <= fig.bbox.x1, (width, box)
            assert len(text.get_text().splitlines()) <= 3
            plt.close(fig)

    def test_bars_side_by_side(self, tmp_path: Path) -> None:
        t = tally(baseline=True, divergent=4)  # baseline diverges nowhere: one series
        for _k in range(3):  # a baseline that diverges at token 1 too
            primary = observation(100.0)
            other = observation(100.0, ids=(1, 3))
            t.add(primary, other, compare(primary, other, 5), other, compare(primary, other, 5))
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        drawn: list = []
        real = plt.Axes.hist

        def spy(ax, x, *args, **kwargs):
            result = real(ax, x, *args, **kwargs)
            drawn.append(result[2])
            return result

        plt.Axes.hist = spy  # type: ignore[method-assign]
        try:
            report.plot(tmp_path, t, "x")
        finally:
            plt.Axes.hist = real  # type: ignore[method-assign]
        [containers] = drawn
        candidate, baseline = (list(c) for c in containers)
        for a, b in zip(candidate, baseline, strict=True):  # same bins, never overlapping
            assert a.get_x() + a.get_width() <= b.get_x() + 1e-9
