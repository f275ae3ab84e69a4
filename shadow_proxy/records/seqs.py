"""Which values of a sequence were seen: gaps, duplicates and tail loss, bounded.

Pure. Used by the consumer's accounting (per publisher: record ``seq`` and
transport sequence) and by record sources to count each
``(publisher_id, tap, seq)`` once. Values are kept as sorted disjoint runs; at
most ``max_holes`` holes are remembered, beyond which the oldest hole is
written off as lost (a value that still arrives into it later counts as a
duplicate). Memory: two lists of at most ``max_holes + 1`` integers.
"""

from __future__ import annotations

import bisect

import attrs

DEFAULT_MAX_HOLES = 4096


@attrs.define
class SeqTracker:
    """Which values of one sequence were seen, as sorted disjoint [start, end) runs."""

    max_holes: int = DEFAULT_MAX_HOLES
    duplicates: int = 0
    written_off: int = 0
    _starts: list[int] = attrs.field(factory=list)
    _ends: list[int] = attrs.field(factory=list)
    _anchor: int | None = None
    _end: int | None = None

    def observe(self, value: int) -> bool:
        """Note one value; False if it was seen before (a duplicate)."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, value) - 1
        if i >= 0 and value < ends[i]:
            self.duplicates += 1
            return False
        joins_left = i >= 0 and ends[i] == value
        joins_right = i + 1 < len(starts) and starts[i + 1] == value + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = value + 1
        elif joins_right:
            starts[i + 1] = value
        else:
            starts.insert(i + 1, value)
            ends.insert(i + 1, value + 1)
            if len(starts) > self.max_holes + 1:
                self.written_off += starts[1] - ends[0]
                ends[0] = ends[1]
                del starts[1], ends[1]
        return True

    def anchor(self, start: int) -> None:
        """Values from ``start`` on are expected: set only before anything is seen."""
        if not self._starts and self._anchor is None:
            self._anchor = start

    def confirm_end(self, end: int) -> None:
        """Every value below ``end`` was sent (heartbeat, past its grace)."""
        if self._end is None or end > self._end:
            self._end = end

    @property
    def first(self) -> int | None:
        return self._starts[0] if self._starts else None

    @property
    def last(self) -> int | None:
        return self._ends[-1] - 1 if self._ends else None

    @property
    def seen(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def gaps(self) -> int:
        """Values missing between the start of the range and the highest seen."""
        if not self._starts:
            return 0
        holes = sum(self._starts[k + 1] - self._ends[k] for k in range(len(self._starts) - 1))
        if self._anchor is not None and self._anchor < self._starts[0]:
            holes += self._starts[0] - self._anchor
        return holes + self.written_off

    def tail_loss(self) -> int:
        """Values a heartbeat confirmed as sent, above the highest seen, never seen."""
        if self._end is None:
            return 0
        top = self._ends[-1] if self._ends else self._anchor
        if top is None:
            return 0
        return max(0, self._end - top)
