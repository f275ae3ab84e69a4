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
            t.add(primary, candidate, compare(primary, candidate, 5), base,
                  compare(primary, base, 5))  # fmt: skip
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
        assert "candidate / primary 95% CI" in text
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
        assert "baseline/primary p50" in text and "candidate / baseline 95% CI" in text
        assert "counted = the candidate differs and the baseline does not" in text

    def test_nothing_replayed(self, tmp_path: Path) -> None:
        summary = report.write_report(tmp_path, Tally(has_baseline=False), RUN, "x")
        assert summary["replayed"] == 0
        assert "| exact match rate | - |" in (tmp_path / report.REPORT).read_text()
        assert (tmp_path / report.DIVERGENCE_PNG).read_bytes()[:4] == b"\x89PNG"
