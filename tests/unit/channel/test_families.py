"""Metric families of processes that come and go: counts summed over every source and
never lost whatever the order of reports, ``_created`` the earliest, gauges of live
sources only and summed only where they add up."""

from __future__ import annotations

from shadow_proxy.channel.families import Totals


def counter(value: float, labels: dict | None = None, created: float = 1.7e9) -> list:
    labels = labels or {}
    return [
        "x",
        "counter",
        "doc",
        [["x_total", labels, value], ["x_created", labels, created]],
    ]


def gauge(value: float, name: str = "g") -> list:
    return [name, "gauge", "doc", [[name, {}, value]]]


def histogram(count: float) -> list:
    return [
        "h",
        "histogram",
        "doc",
        [
            ["h_bucket", {"le": "1.0"}, count],
            ["h_bucket", {"le": "+Inf"}, count],
            ["h_count", {}, count],
            ["h_sum", {}, count / 2],
            ["h_created", {}, 1.7e9],
        ],
    ]


def samples(totals: Totals) -> dict:
    return {
        (name, sample, tuple(sorted(labels.items()))): value
        for name, _, _, rows in totals.families()
        for sample, labels, value in rows
    }


class TestCounts:
    """Counts of every source are summed; a source's highest report is its count."""

    def test_sources_are_summed(self):
        totals = Totals()
        totals.update("a", [counter(3), histogram(2)])
        totals.update("b", [counter(4), histogram(5)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 7
        assert got[("h", "h_count", ())] == 7
        assert got[("h", "h_bucket", (("le", "+Inf"),))] == 7
        assert got[("h", "h_sum", ())] == 3.5

    def test_a_gone_source_still_counts(self):
        totals = Totals()
        totals.update("a", [counter(5)])
        totals.retire("a")
        totals.update("a2", [counter(1)])
        assert samples(totals)[("x", "x_total", ())] == 6  # never backwards

    def test_a_report_read_after_the_death_still_counts(self):
        """A worker's last snapshot read after its death was seen: not lost, not twice."""
        totals = Totals()
        totals.update(1, [counter(5)])
        totals.retire(1)
        totals.update(2, [counter(1)])
        totals.update(1, [counter(8)])  # the dead worker's last words, late
        assert samples(totals)[("x", "x_total", ())] == 9
        totals.update(1, [counter(6)])  # an older report, later still: nothing changes
        assert samples(totals)[("x", "x_total", ())] == 9

    def test_a_lost_report_is_made_good_by_the_next(self):
        totals = Totals()
        totals.update("a", [counter(1)])
        totals.update("a", [counter(4)])  # the report of 2 and 3 never came
        assert samples(totals)[("x", "x_total", ())] == 4

    def test_final_values_raise_a_dead_source(self):
        totals = Totals()
        totals.update(1, [counter(5, {"tap": "kv"})])
        totals.retire(1)
        totals.raise_to(1, "x", "counter", "doc", [("x_total", {"tap": "kv"}, 8)])
        assert samples(totals)[("x", "x_total", (("tap", "kv"),))] == 8
        totals.raise_to(1, "x", "counter", "doc", [("x_total", {"tap": "kv"}, 2)])
        assert samples(totals)[("x", "x_total", (("tap", "kv"),))] == 8


class TestNotCounts:
    """``_created`` is not summed (the earliest); gauges belong to live sources."""

    def test_created_is_the_earliest(self):
        totals = Totals()
        totals.update("a", [counter(1, created=200.0), histogram(1)])
        totals.update("b", [counter(1, created=100.0), histogram(1)])
        got = samples(totals)
        assert got[("x", "x_created", ())] == 100.0
        assert got[("h", "h_created", ())] == 1.7e9

    def test_gauges_of_live_sources_latest_report(self):
        totals = Totals()
        totals.update("a", [gauge(9)])
        totals.update("b", [gauge(2)])
        assert samples(totals)[("g", "g", ())] == 2  # not 11: the latest report's
        totals.retire("b")
        assert samples(totals)[("g", "g", ())] == 9
        totals.retire("a")
        assert ("g", "g", ()) not in samples(totals)

    def test_additive_gauges_add_up(self):
        name = "shadow_tokenizer_cache_bytes"
        totals = Totals()
        totals.update("a", [gauge(100, name)])
        totals.update("b", [gauge(50, name)])
        assert samples(totals)[(name, name, ())] == 150
        totals.retire("a")
        assert samples(totals)[(name, name, ())] == 50

    def test_a_replaced_source_does_not_move_created_later(self):
        """The total still holds the gone source's counts, so it was created when
        that source was."""
        totals = Totals()
        totals.update("shard-0", [counter(3, created=1.7e9)])
        totals.retire("shard-0")
        totals.update("shard-0b", [counter(1, created=1.7e9 + 60)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 4
        assert got[("x", "x_created", ())] == 1.7e9
