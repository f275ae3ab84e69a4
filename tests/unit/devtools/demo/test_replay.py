"""The replay run's checks and table: what the candidate was told to do against what
the report says. (The whole run, with its frontends and shadow-replay:
tests/integration/test_demo.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools.demo import replay
from tests.support.trace_records import envelope, write_records


def latency(primary: float, baseline: float, candidate: float, verdict: str) -> dict[str, Any]:
    return {
        "primary": {"p50": primary},
        "baseline": {"p50": baseline},
        "candidate": {"p50": candidate},
        "candidate_vs_baseline_p50": round(candidate / baseline, 4),
        "verdict": verdict,
    }


def result() -> dict[str, Any]:
    """A replay of 10 records, 2 of which the candidate diverges on at token 4."""
    summary = {
        "records": 10,
        "replayed": 10,
        "skipped": {},
        "errors": 0,
        "baseline_errors": 0,
        "prompt_token_mismatches": 0,
        "baseline_prompt_token_mismatches": 0,
        "exact_match_rate": 0.8,
        "first_divergence": {"p50": 4.0, "p90": 4.0, "p99": 4.0},
        "differences": {"output": {"differs": 2, "noise": 0, "counted": 2}},
        "ttft_ms": latency(30.0, 22.0, 72.0, "higher"),
        "itl_ms": latency(5.1, 5.0, 10.0, "higher"),
        "e2e_ms": latency(190.0, 180.0, 400.0, "higher"),
    }
    return {
        "title": "replay",
        "kind": "replay",
        "source": {"run": 1, "title": "streaming", "records_file": "r.rec", "records": 10},
        "candidate": {
            "knobs": "ttft 70 ms, itl 10 ms, 20% diverging at token 4",
            "extra_ttft_ms": 50.0,
            "extra_itl_ms": 5.0,
        },
        "baseline": {"knobs": "ttft 20 ms, itl 5 ms"},
        "concurrency": 16,
        "expected": {"diverging": 2, "exact_match_rate": 0.8, "diverge_at": 4},
        "summary": summary,
        "command": "shadow-replay r.rec --candidate http://c",
        "report": "/out/replay/report.md",
        "exit_status": {"candidate": 0, "baseline": 0, "shadow-replay": 0},
        "timings_s": {"replay_s": 3.0, "total_s": 7.0},
        "ok": True,
        "failures": [],
    }


def failures_after(change: Any) -> list[str]:
    changed = copy.deepcopy(result())
    change(changed)
    return replay.replay_failures(changed)


class TestChecks:
    """Each effect the candidate was given must show; every record must be replayed."""

    def test_holds(self) -> None:
        assert replay.replay_failures(result()) == []

    def test_no_summary(self) -> None:
        assert failures_after(lambda r: r.update(summary={})) == [
            "shadow-replay wrote no summary.json"
        ]

    def test_exact_match_rate_must_be_the_diverging_share(self) -> None:
        (failure,) = failures_after(lambda r: r["summary"].update(exact_match_rate=0.9))
        assert failure == (
            "exact-match rate 0.9; the candidate diverges on 2 of 10 request ids (rate 0.8)"
        )

    def test_divergences_counted_against_the_baseline(self) -> None:
        def noise(r: dict) -> None:
            r["summary"]["differences"]["output"].update(noise=2, counted=0)

        assert failures_after(noise) == [
            "0 output differences counted against the baseline, 2 expected"
        ]

    def test_first_divergent_position(self) -> None:
        (failure,) = failures_after(
            lambda r: r["summary"].update(first_divergence={"p50": 4.0, "p99": 5.0})
        )
        assert failure.startswith("first divergent position") and "at token 4" in failure

    @pytest.mark.parametrize("metric", ["ttft_ms", "itl_ms"])
    def test_a_slower_candidate_must_be_judged_higher(self, metric: str) -> None:
        (failure,) = failures_after(lambda r: r["summary"][metric].update(verdict="no_difference"))
        assert failure.startswith(f"{metric} verdict 'no_difference'")

    def test_no_verdict_asked_when_not_slower(self) -> None:
        def same_speed(r: dict) -> None:
            r["candidate"].update(extra_ttft_ms=0.0, extra_itl_ms=0.0)
            r["summary"]["ttft_ms"]["verdict"] = r["summary"]["itl_ms"]["verdict"] = "lower"

        assert failures_after(same_speed) == []

    @pytest.mark.parametrize(
        ("change", "expected"),
        [
            (
                lambda r: r["summary"].update(replayed=9),
                "shadow-replay read 10 records and replayed 9; the file holds 10",
            ),
            (lambda r: r["summary"].update(errors=1), "shadow-replay: errors = 1"),
            (
                lambda r: r["summary"].update(baseline_errors=2),
                "shadow-replay: baseline_errors = 2",
            ),
            (
                lambda r: r["summary"].update(prompt_token_mismatches=1),
                "shadow-replay: prompt_token_mismatches = 1",
            ),
            (
                lambda r: r["summary"].update(skipped={"late": 1}),
                "shadow-replay skipped records: {'late': 1}",
            ),
            (lambda r: r["exit_status"].update(candidate=-9), "candidate exited with status -9"),
        ],
    )
    def test_accounting(self, change: Any, expected: str) -> None:
        assert failures_after(change) == [expected]


class TestTable:
    """Latencies with the verdicts, the outputs, the report path, the verdict last."""

    def test_lines(self) -> None:
        lines = replay.format_replay(result()).splitlines()
        assert lines[0] == (
            "== replay: the 10 shadow-replay records of run 1 (streaming), shadow-replay "
            "--speed max, concurrency 16"
        )
        assert "(the primary +50 ms TTFT, +5 ms ITL)" in lines[1]
        assert (
            "  p50 ms                  primary  baseline  candidate  candidate/baseline  verdict"
            in lines
        )
        assert (
            "  TTFT                       30.0      22.0       72.0               3.27x  higher"
            in lines
        )
        assert (
            "  exact match (candidate vs primary)     80.0%  (2 request ids picked to diverge)"
            in lines
        )
        assert "  first divergent position p50 / p99     4 / 4" in lines
        assert "report  /out/replay/report.md" in lines
        assert lines[-1].startswith("OK: every record replayed")

    def test_failures_listed(self) -> None:
        failed = result()
        failed.update(ok=False, failures=["candidate exited with status 1"])
        assert replay.format_replay(failed).splitlines()[-2:] == [
            "FAILED:",
            "  - candidate exited with status 1",
        ]


def test_request_ids_in_file_order(tmp_path: Path) -> None:
    path = write_records(
        tmp_path / "r.rec",
        [envelope(i, [1, 2], request_id=f"id-{i}") for i in (2, 0, 1)] + [b"\x93garbage"],
    )
    assert replay.request_ids(path) == ["id-2", "id-0", "id-1"]


class TestNear:
    """The printed command names the tokenizer relative to where the demo runs."""

    def test_below_the_working_directory(self, tmp_path: Path, monkeypatch) -> None:
        (tmp_path / ".models" / "deepseek").mkdir(parents=True)
        monkeypatch.chdir(tmp_path)
        assert replay.near(tmp_path / ".models" / "deepseek") == ".models/deepseek"

    def test_elsewhere(self, tmp_path: Path, monkeypatch) -> None:
        (tmp_path / "here").mkdir()
        monkeypatch.chdir(tmp_path / "here")
        assert replay.near(tmp_path / "models") == str(tmp_path / "models")
