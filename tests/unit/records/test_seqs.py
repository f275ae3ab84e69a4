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


class TestTail:
    """Loss after the highest value seen shows only once a heartbeat confirms the end."""

    def test_tail_loss_needs_a_confirmed_end(self):
        tracker = SeqTracker()
        for value in range(5):
            tracker.observe(value)
        assert tracker.tail_loss() == 0
        tracker.confirm_end(8)
        assert tracker.tail_loss() == 3  # 5, 6, 7
        tracker.confirm_end(6)  # an older heartbeat never lowers the end
        assert tracker.tail_loss() == 3
        tracker.observe(5)
        assert tracker.tail_loss() == 2

    def test_anchor_counts_what_never_came_before_the_first(self):
        tracker = SeqTracker()
        tracker.anchor(10)
        for value in (12, 13):
            tracker.observe(value)
        assert tracker.gaps() == 2  # 10 and 11
        tracker.anchor(0)  # set once only
        assert tracker.gaps() == 2

    def test_anchor_after_values_is_ignored(self):
        tracker = SeqTracker()
        tracker.observe(7)
        tracker.anchor(0)
        assert tracker.gaps() == 0

    def test_an_anchor_alone_with_a_confirmed_end_is_all_tail(self):
        tracker = SeqTracker()
        tracker.anchor(10)
        tracker.confirm_end(13)
        assert (tracker.tail_loss(), tracker.gaps(), tracker.first, tracker.last) == (
            3,
            0,
            None,
            None,
        )

    def test_a_late_arrival_into_a_written_off_hole_is_a_duplicate(self):
        tracker = SeqTracker(max_holes=1)
        for value in (0, 2, 4):  # holes at 1 and 3; the oldest (1) is written off
            tracker.observe(value)
        assert tracker.written_off == 1
        assert not tracker.observe(1)
        assert tracker.duplicates == 1
        assert tracker.observe(3)
