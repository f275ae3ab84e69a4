"""The run's own facts: the warm-up left out of the counts, the summary's ``run``
section, and the progress line."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from shadow_proxy.replay.options import ReplayOptions
from shadow_proxy.replay.run_facts import Warmup, progress_line, run_facts
from shadow_proxy.replay.schedule import ScheduleConfig, Scheduler
from shadow_proxy.replay.stats import Tally


async def _nothing(_item: object) -> None:
    return None


def _scheduler() -> Scheduler[object]:
    return Scheduler(ScheduleConfig(concurrency=4), _nothing, _nothing)


class TestWarmup:
    def test_the_first_n_records(self) -> None:
        warmup = Warmup(records=2)
        assert [warmup.warming({"arrival_unix_ns": i}) for i in range(4)] == [
            True,
            True,
            False,
            False,
        ]
        assert warmup.excluded == 2

    def test_records_within_s_of_the_first_arrival(self) -> None:
        warmup = Warmup(seconds=1.0)
        arrivals = [5_000_000_000, 5_500_000_000, 6_000_000_000, 7_000_000_000]
        assert [warmup.warming({"arrival_unix_ns": a}) for a in arrivals] == [
            True,
            True,
            False,
            False,
        ]

    def test_none_by_default(self) -> None:
        warmup = Warmup()
        assert not warmup.warming({"arrival_unix_ns": 1}) and warmup.excluded == 0


class TestRunFacts:
    def test_options_timing_and_what_ended_it(self, tmp_path: Path) -> None:
        options = ReplayOptions(candidate="http://c", out_dir=tmp_path, speed=None, warmup=3)
        started = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)
        run = run_facts(
            options, _scheduler(), lambda: {"bad": 1}, (started, 2.5, 0.25), "signal", 3
        )
        assert run["speed"] == "max" and run["queue_bound"] == 8
        assert run["unreadable"] == {"bad": 1} and run["started"] == "2026-12-03T12:00:00+00:00"
        assert (run["elapsed_s"], run["cpu_s"]) == (2.5, 0.25)
        assert run["stopped_by"] == "signal" and run["complete"] is False
        assert run["warmup"] == {"records": 3, "seconds": 0.0, "excluded": 3}

    def test_no_warmup_section_without_one(self, tmp_path: Path) -> None:
        options = ReplayOptions(candidate="http://c", out_dir=tmp_path)
        started = datetime.datetime.now(datetime.UTC)
        run = run_facts(options, _scheduler(), None, (started, 1.0, 0.1), "end", 0)
        assert "warmup" not in run and run["complete"] is True and run["unreadable"] == {}


class TestProgressLine:
    def test_counts_and_file_progress(self) -> None:
        tally = Tally(has_baseline=False, tolerance=0.5)
        line = progress_line(tally, _scheduler(), time.monotonic() - 1.0, (50, 100))
        assert line.startswith("\rreplayed=0 (0.0/s) skipped=0 errors=0 in_flight=0 queue=0")
        assert "exact_match=0/0" in line and "50%" in line
