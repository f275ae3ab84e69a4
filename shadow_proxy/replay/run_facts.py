"""What a replay run says about itself: the summary's ``run`` section, the
progress line on stderr, and the warm-up that is replayed but not counted."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from shadow_proxy.records.limits import reading_progress

if TYPE_CHECKING:
    from shadow_proxy.replay.options import ReplayOptions
    from shadow_proxy.replay.schedule import Scheduler
    from shadow_proxy.replay.stats import Tally


@attrs.define
class Warmup:
    """``--warmup N`` / ``--warmup-s S``: the first N records sent, or those that
    arrived within S s of the first, are replayed and left out of every count."""

    records: int = 0
    seconds: float = 0.0
    excluded: int = 0
    _first_arrival: int | None = None

    def warming(self, envelope: Mapping[str, Any]) -> bool:
        """Whether this record (about to be counted) is part of the warm-up."""
        arrival = envelope.get("arrival_unix_ns")
        if self._first_arrival is None and isinstance(arrival, int):
            self._first_arrival = arrival
        warm = self.excluded < self.records or (
            self.seconds > 0
            and isinstance(arrival, int)
            and self._first_arrival is not None
            and arrival - self._first_arrival < self.seconds * 1e9
        )
        self.excluded += warm
        return warm


def run_facts(
    o: ReplayOptions,
    scheduler: Scheduler[Any],
    unreadable: Callable[[], Mapping[str, int]] | None,
    timing: tuple[datetime.datetime, float, float],
    stopped_by: str,
    warm_excluded: int,
) -> dict[str, Any]:
    """The summary's ``run``: the options, the queue, what was unreadable, when
    and how long (``timing``: wall start, elapsed s, CPU s), and what ended it."""
    started_wall, elapsed, cpu = timing
    run: dict[str, Any] = {
        "candidate": o.candidate,
        "baseline": o.baseline,
        "speed": "max" if o.speed is None else o.speed,
        "concurrency": o.concurrency,
        "max_lag_s": o.max_lag_s,
        "model": o.model,
        "compare": o.compare,
        "max_records": o.max_records,
        "duration_s": o.duration_s,
        "queue_bound": scheduler.config.bound,
        "max_queue_depth": scheduler.counts.max_depth,
        "unreadable": dict(unreadable()) if unreadable else {},
        "started": started_wall.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed, 3),
        # CPU of this process (all threads) while replaying, report excluded.
        "cpu_s": round(cpu, 3),
        "stopped_by": stopped_by,
        "complete": stopped_by not in ("signal", "error"),
    }
    if o.warmup or o.warmup_s:
        run["warmup"] = {"records": o.warmup, "seconds": o.warmup_s, "excluded": warm_excluded}
    return run


def progress_line(
    tally: Tally, scheduler: Scheduler[Any], started: float, read: tuple[int, int] | None
) -> str:
    """``replayed=N (R/s) skipped= errors= in_flight= queue= exact_match=`` (and
    for files, how far and an ETA), drawn over itself with a carriage return."""
    elapsed = max(time.monotonic() - started, 1e-9)
    skipped = sum(tally.skipped.values())
    where = "" if read is None else " " + reading_progress(*read, elapsed)
    return (
        f"\rreplayed={tally.replayed} ({tally.replayed / elapsed:.1f}/s) skipped={skipped} "
        f"errors={tally.errors} in_flight={scheduler.counts.in_flight} "
        f"queue={scheduler.depth} exact_match={tally.exact_matches}/{tally.compared}{where}   "
    )
