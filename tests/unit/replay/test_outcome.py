"""The end of a run on the command line: the headline, and the exit status and
line of a run with nothing to show."""

from __future__ import annotations

from shadow_proxy.replay.outcome import EXIT_FAILED, EXIT_USAGE, headline, nothing_to_show


def _summary(**changes):
    summary = {
        "records": 4,
        "replayed": 4,
        "skipped": {},
        "errors": 0,
        "exact_match_rate": 1.0,
        "run": {"complete": True, "unreadable": {}},
    }
    return {**summary, **changes}


class TestHeadline:
    def test_headline(self) -> None:
        """The ratio the verdict judged, its interval, n and reference (not the
        candidate/primary ratio beside a candidate/baseline verdict)."""
        judged = {"reference": "baseline", "ratio_p50": 2.31, "ci95": [2.1, 2.5], "n": 180}
        summary = {
            "records": 5,
            "replayed": 4,
            "skipped": {"late": 1},
            "errors": 0,
            "exact_match_rate": 0.5,
            "ttft_ms": {"ratio_p50": 0.3368, "verdict": "higher", "judged": judged},
        }
        assert headline(summary) == (
            "records=5 replayed=4 skipped=1 errors=0 exact_match_rate=0.5 "
            "ttft candidate/baseline p50=2.31 [2.1, 2.5] n=180: higher"
        )


class TestNothingToShow:
    def test_a_run_with_pairs_has_something(self) -> None:
        assert nothing_to_show(_summary()) is None

    def test_no_records(self) -> None:
        summary = _summary(records=0, replayed=0, run={"complete": True, "unreadable": {"x": 2}})
        assert nothing_to_show(summary) == (
            EXIT_USAGE,
            "no records in the source (2 unreadable entries)",
        )

    def test_request_only_records_get_the_hint(self) -> None:
        summary = _summary(replayed=0, skipped={"no_response": 4})
        status, line = nothing_to_show(summary) or (0, "")
        assert status == EXIT_USAGE and "--no-compare replays them for load" in line

    def test_every_request_failed(self) -> None:
        examples = [{"message": "engine overloaded"}]
        summary = _summary(errors=4, error_examples=examples)
        assert nothing_to_show(summary) == (
            EXIT_FAILED,
            "every request to the candidate failed (4 of 4): engine overloaded",
        )
