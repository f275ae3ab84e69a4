"""Metric families of processes that come and go: summed, counters never backwards."""

from __future__ import annotations

from shadow_proxy.channel.families import Totals


def counter(value: float, labels: dict | None = None) -> list:
    labels = labels or {}
    return [
        "x",
        "counter",
        "doc",
        [["x_total", labels, value], ["x_created", labels, 1.7e9]],
    ]


def gauge(value: float) -> list:
    return ["g", "gauge", "doc", [["g", {}, value]]]


def samples(totals: Totals) -> dict:
    return {
        (name, sample, tuple(sorted(labels.items()))): value
        for name, _, _, rows in totals.families()
        for sample, labels, value in rows
    }


class TestTotals:
    def test_sources_are_summed(self):
        totals = Totals()
        totals.update("a", [counter(3), gauge(1)])
        totals.update("b", [counter(4), gauge(2)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 7
        assert got[("g", "g", ())] == 3

    def test_retired_counters_stay_gauges_go(self):
        totals = Totals()
        totals.update("a", [counter(5), gauge(9)])
        totals.retire("a")
        totals.update("a2", [counter(1), gauge(2)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 6  # never backwards
        assert got[("g", "g", ())] == 2
        assert ("x", "x_created", ()) in got and got[("x", "x_created", ())] == 1.7e9

    def test_keep_excludes_families_and_add_counts_finals(self):
        totals = Totals()
        totals.update("w", [counter(5, {"tap": "kv"})])
        totals.retire("w", keep=lambda name: name != "x")
        totals.add("x", "counter", "doc", [("x_total", {"tap": "kv"}, 8)])
        assert samples(totals)[("x", "x_total", (("tap", "kv"),))] == 8


def created(value: float, when: float) -> list:
    return ["x", "counter", "doc", [["x_total", {}, value], ["x_created", {}, when]]]


class TestCreated:
    """``*_created`` is a timestamp, not a count: never summed across sources (issue 29)."""

    def test_the_earliest_stands_not_the_sum(self):
        totals = Totals()
        totals.update("shard-0", [created(3, 1.7e9 + 5)])
        totals.update("shard-1", [created(4, 1.7e9)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 7
        assert got[("x", "x_created", ())] == 1.7e9

    def test_a_replaced_source_does_not_move_it_later(self):
        """The total still holds the retired source's counts, so it was created
        when that source was."""
        totals = Totals()
        totals.update("shard-0", [created(3, 1.7e9)])
        totals.retire("shard-0")
        totals.update("shard-0b", [created(1, 1.7e9 + 60)])
        got = samples(totals)
        assert got[("x", "x_total", ())] == 4
        assert got[("x", "x_created", ())] == 1.7e9
