"""Counters and histograms kept as the plain data a report carries. Pure.

A shard reports its metrics to the worker's main after the records they count
(``worker/shard/loop.py``), so under paced traffic after nearly every request.
prometheus_client's ``collect`` builds every sample afresh (0.45-0.64 ms for a
shard's ~90 samples, measured in the demo's shards); a ``Tally`` keeps its
samples as the ``Family`` lists the report sends (``channel/families.py``) and
updates them in place, so a report is the encoding alone.

The families are those prometheus_client would export for the same metrics:
the same names, types, samples and labels in the same order (``_total`` and
``_created`` per label set; ``_bucket`` with cumulative counts, ``_count``,
``_sum`` and ``_created``), as ``tests/unit/channel/test_tally.py`` checks
against prometheus_client itself. Label values are strings, as there.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.utils import floatToGoString

from shadow_proxy.channel.families import Family

#: Families computed when a report is made (values read from elsewhere).
FamilySource = Callable[[], Iterable[Family]]


class CounterChild:
    __slots__ = ("_sample",)

    def __init__(self, sample: list[Any]):
        self._sample = sample

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._sample[2] += amount

    @property
    def value(self) -> float:
        return float(self._sample[2])


class HistogramChild:
    __slots__ = ("_bounds", "_buckets", "_count", "_counts", "_sum")

    def __init__(self, bounds: Sequence[float], samples: list[list[Any]]):
        self._bounds = bounds
        #: The ``_bucket`` samples (the last is ``+Inf``), then ``_count`` and ``_sum``.
        self._buckets = samples[: len(bounds) + 1]
        self._count = samples[len(bounds) + 1]
        self._sum = samples[len(bounds) + 2]
        #: Observations per bucket, not cumulative (made cumulative per report).
        self._counts = [0] * (len(bounds) + 1)

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._count[2] += 1.0
        self._sum[2] += value

    def settle(self) -> None:
        """The ``_bucket`` samples from the counts (cumulative, as exported)."""
        total = 0
        for sample, n in zip(self._buckets, self._counts, strict=True):
            total += n
            sample[2] = float(total)


class _Metric:
    """One family: its children by label values, their samples in its ``Family``."""

    def __init__(self, family: Family, labelnames: Sequence[str]):
        self.family = family
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.family[0]}: labels {self.labelnames}, got {key}")
            child = self.children[key] = self._child(dict(zip(self.labelnames, key, strict=True)))
        return child

    def _child(self, labels: dict[str, str]) -> Any:
        raise NotImplementedError


class Counter(_Metric):
    def _child(self, labels: dict[str, str]) -> CounterChild:
        name = self.family[0]
        total = [f"{name}_total", labels, 0.0]
        self.family[3] += [total, [f"{name}_created", labels, time.time()]]
        return CounterChild(total)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


class Histogram(_Metric):
    def __init__(self, family: Family, labelnames: Sequence[str], buckets: Sequence[float]):
        super().__init__(family, labelnames)
        bounds = sorted(float(b) for b in buckets)
        if bounds and bounds[-1] == math.inf:
            bounds.pop()
        self.bounds = tuple(bounds)

    def _child(self, labels: dict[str, str]) -> HistogramChild:
        name = self.family[0]
        samples = [
            [f"{name}_bucket", {**labels, "le": floatToGoString(b)}, 0.0]
            for b in (*self.bounds, math.inf)
        ]
        samples += [[f"{name}_count", labels, 0.0], [f"{name}_sum", labels, 0.0]]
        self.family[3] += [*samples, [f"{name}_created", labels, time.time()]]
        return HistogramChild(self.bounds, samples)

    def observe(self, value: float) -> None:
        self.labels().observe(value)


class Tally:
    """Metrics kept as report-ready families (see the module docstring)."""

    def __init__(self) -> None:
        self._families: list[Family] = []
        self._histograms: list[Histogram] = []
        self._sources: list[FamilySource] = []

    def _family(self, name: str, kind: str, doc: str) -> Family:
        if any(f[0] == name for f in self._families):
            raise ValueError(f"metric {name!r} is already in the tally")
        family: Family = [name, kind, doc, []]
        self._families.append(family)
        return family

    def counter(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> Counter:
        counter = Counter(self._family(name.removesuffix("_total"), "counter", doc), labelnames)
        if not labelnames:
            counter.labels()  # exported from the start, as prometheus_client does
        return counter

    def histogram(
        self, name: str, doc: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        histogram = Histogram(self._family(name, "histogram", doc), labelnames, buckets)
        self._histograms.append(histogram)
        if not labelnames:
            histogram.labels()
        return histogram

    def register(self, source: FamilySource) -> None:
        """Families read when a report is made, after the tally's own."""
        self._sources.append(source)

    def families(self) -> list[Family]:
        """Every family, absolute values, for a report. The tally's own are its
        live lists: encode them before the next update."""
        for histogram in self._histograms:
            for child in histogram.children.values():
                child.settle()
        families = list(self._families)
        for source in self._sources:
            families += source()
        return families

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A sample's value, or None (as ``CollectorRegistry.get_sample_value``)."""
        want = labels or {}
        for family in self.families():
            for sample_name, sample_labels, value in family[3]:
                if sample_name == name and sample_labels == want:
                    return float(value)
        return None
