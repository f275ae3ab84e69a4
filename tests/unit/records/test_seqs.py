"""Which values of a sequence were seen: gaps, duplicates, tail loss, bounded memory."""

from __future__ import annotations

from shadow_proxy.records.seqs import SeqTracker


class TestSeqTracker:
    """Missing values are counted over the seen range, in any arrival order."""

    def test_reordering_is_not_a_gap(self):
        tracker = SeqTracker()
        for value in (4, 6, 5, 7):
            tracker.observe(value)
        assert tracker.gaps() == 0
        tracker.observe(10)
        assert tracker.gaps() == 2
        tracker.observe(8)
        assert tracker.gaps() == 1
        assert (tracker.first, tracker.last, tracker.seen) == (4, 10, 6)

    def test_arrival_below_the_first_extends_the_range(self):
        tracker = SeqTracker()
        for value in (5, 3):
            tracker.observe(value)
        assert tracker.gaps() == 1

    def test_duplicates(self):
        tracker = SeqTracker()
        assert tracker.observe(1)
        assert not tracker.observe(1)
        assert tracker.duplicates == 1
        assert tracker.gaps() == 0

    def test_holes_are_bounded(self):
        tracker = SeqTracker(max_holes=3)
        for value in range(0, 20, 2):  # 9 holes
            tracker.observe(value)
        assert len(tracker._starts) <= 4
        assert tracker.gaps() == 9
        assert tracker.written_off > 0
        tracker.observe(17)  # a remembered hole fills
        assert tracker.gaps() == 8
