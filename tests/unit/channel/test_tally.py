"""A tally's families are what prometheus_client exports for the same metrics
(names, types, samples, labels, values; ``_created`` aside), and a report of
them is plain data the relays carry."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from shadow_proxy.channel.families import snapshot
from shadow_proxy.channel.tally import Tally

BUCKETS = (0.001, 0.01, 0.1, 1, 10)


def without_created(families: list) -> list:
    """Samples but ``_created``, values rounded (sums of floats in another order)."""
    return [
        [
            name,
            kind,
            doc,
            [[n, labels, round(v, 9)] for n, labels, v in samples if not n.endswith("_created")],
        ]
        for name, kind, doc, samples in families
    ]


def created(families: list) -> list:
    return [(s[0], s[1]) for f in families for s in f[3] if s[0].endswith("_created")]


def both() -> tuple[CollectorRegistry, list, Tally, list]:
    registry, tally = CollectorRegistry(), Tally()
    prom = [
        Counter("c_plain", "a counter", registry=registry),
        Counter("c_labelled", "by reason", ["reason"], registry=registry),
        Histogram("h_plain", "a histogram", buckets=BUCKETS, registry=registry),
        Histogram("h_labelled", "by route", ["route"], buckets=BUCKETS, registry=registry),
    ]
    mine = [
        tally.counter("c_plain", "a counter"),
        tally.counter("c_labelled", "by reason", ["reason"]),
        tally.histogram("h_plain", "a histogram", buckets=BUCKETS),
        tally.histogram("h_labelled", "by route", ["route"], buckets=BUCKETS),
    ]
    return registry, prom, tally, mine


values = st.one_of(
    st.sampled_from([*BUCKETS, 0.0, 100.0]),
    st.floats(min_value=0, max_value=50, allow_nan=False),
)
operations = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c"]), values), max_size=40
)


class TestSameAsPrometheus:
    @given(operations)
    def test_same_families_after_any_updates(self, ops: list) -> None:
        registry, prom, tally, mine = both()
        for index, label, value in ops:
            for metrics in (prom, mine):
                metric = metrics[index]
                child = metric.labels(label) if index % 2 else metric
                if index < 2:
                    child.inc(value)
                else:
                    child.observe(value)
        expected, got = snapshot(registry), tally.families()
        assert without_created(got) == without_created(expected)
        assert created(got) == created(expected)

    def test_bucket_bounds_are_inclusive(self) -> None:
        tally = Tally()
        tally.histogram("h", "doc", buckets=(1, 2)).observe(1)
        value = tally.get_sample_value
        assert value("h_bucket", {"le": "1.0"}) == 1
        assert value("h_bucket", {"le": "+Inf"}) == 1
        assert value("h_count") == 1 and value("h_sum") == 1

    def test_counters_only_go_up(self) -> None:
        with pytest.raises(ValueError, match="only go up"):
            Tally().counter("c", "doc").inc(-1)

    def test_one_definition_per_name(self) -> None:
        tally = Tally()
        tally.counter("c", "doc")
        with pytest.raises(ValueError, match="already in the tally"):
            tally.counter("c", "again")


class TestReport:
    def test_families_encode_as_plain_data_and_sources_follow(self) -> None:
        tally = Tally()
        tally.counter("c", "doc", ["k"]).labels("x").inc(3)
        tally.register(lambda: [["g", "gauge", "read at report", [["g", {}, 7]]]])
        decoded = msgpack.unpackb(msgpack.packb(tally.families()))
        assert [f[0] for f in decoded] == ["c", "g"]
        assert decoded[0][3][0] == ["c_total", {"k": "x"}, 3.0]
        assert decoded[1][3] == [["g", {}, 7]]

    def test_a_report_is_a_copy_once_encoded(self) -> None:
        tally = Tally()
        counter = tally.counter("c", "doc")
        report = msgpack.packb(tally.families())
        counter.inc()
        assert msgpack.unpackb(report)[0][3][0][2] == 0.0
        assert tally.get_sample_value("c_total") == 1.0
        assert tally.get_sample_value("c_created") is not None
