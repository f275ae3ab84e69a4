"""Metric families of processes that come and go, combined; nothing reported is lost. Pure.

Families travel as plain data (``Family``: name, type, documentation, samples
``[sample_name, labels, value]``), each report a process's absolute values:
a shard's to the worker's main (by its spawn token), the main's (its own and its
shards' combined) to the serving process (by the worker's generation).

``Totals`` keeps, per source, its latest report (a live source's counters only
grow, so its latest report holds its highest values: an update is one
assignment, paid by each shard's report; the sum is made once a second), and
for a source that is gone the highest value each counter sample reached. So no
report is needed twice: a report that is lost is made good by the next, a report
that arrives after its source was declared gone (``retire``: a death seen before
the last report was read) still raises what it counted, and the final values the
serving process works out for a dead worker (``raise_to``: its checkpoint, plus
the loss its death caused) raise the dead source's counters to them.

Combined (``families``), by what a sample means:

- counts (a counter's ``_total``, a histogram's ``_bucket``, ``_count`` and
  ``_sum``, a summary's ``_count`` and ``_sum``): summed over every source, live
  or gone, so a counter never goes backwards when a process is replaced;
- ``_created``: the earliest of every source (the combined count began then);
- gauges: of the live sources only (a gone process holds nothing). Summed only
  where the gauge is an amount that adds up across processes (``ADDITIVE``:
  bytes held, processes counted); any other gauge reported by several live
  sources is the latest report's.

What a SIGKILLed process counted after its last report is not known to anyone:
a shard reports right after the records it counts when idle, once a second
when busy; the worker's tap counters are recovered from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry

#: A metric family as plain data: name, type, documentation and samples
#: ``[sample_name, labels, value]``.
Family = list[Any]

#: Gauges that are amounts adding up across processes.
ADDITIVE = frozenset({"shadow_tokenizer_cache_bytes", "shadow_tokenizer_incremental_processes"})
_COUNTS = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge_histogram": (),
    "summary": ("_count", "_sum"),
}

_Labels = tuple[tuple[str, str], ...]
_Sample = tuple[str, _Labels]


def snapshot(registry: CollectorRegistry) -> list[Family]:
    """A registry's samples as plain data, for a report."""
    return [
        [
            family.name,
            family.type,
            family.documentation,
            [[s.name, s.labels, s.value] for s in family.samples],
        ]
        for family in registry.collect()
    ]


def _meaning(kind: str, family: str, sample: str) -> str:
    """``count``, ``created``, ``additive`` or ``gauge``."""
    if sample.endswith("_created"):
        return "created"
    if any(sample.endswith(suffix) for suffix in _COUNTS.get(kind, ())):
        return "count"
    return "additive" if family in ADDITIVE else "gauge"


class _Source:
    __slots__ = ("counts", "latest", "live", "order")

    def __init__(self) -> None:
        #: The latest report as it came (a live source's: kept as is, read once a
        #: second by ``families``; an update costs nothing on the hot path).
        self.latest: list[Family] = []
        #: family -> sample -> (meaning, value): counts and ``_created`` kept as
        #: the highest values seen, once the source is gone or was raised.
        self.counts: dict[str, dict[_Sample, tuple[str, float]]] | None = None
        self.live = True
        #: When it last reported (a counter over every report): the latest wins.
        self.order = 0


class Totals:
    """Every source's reports, combined as the module docstring says."""

    def __init__(self) -> None:
        self._sources: dict[Hashable, _Source] = {}
        #: name -> (type, documentation), in first-seen order.
        self._meta: dict[str, tuple[str, str]] = {}
        self._reports = 0

    def _source(self, source: Hashable) -> _Source:
        found = self._sources.get(source)
        if found is None:
            found = self._sources[source] = _Source()
        return found

    def update(self, source: Hashable, families: list[Family]) -> None:
        """A report of ``source``: absolute values."""
        state = self._source(source)
        self._reports += 1
        state.order = self._reports
        for name, kind, doc, _ in families:
            if name not in self._meta:
                self._meta[name] = (kind, doc)
        if state.counts is None:
            state.latest = families  # a live source's latest report is its highest
        else:
            self._merge(state, families)
            if state.live:
                state.latest = [f for f in families if f[1] not in _COUNTS]

    def _frozen(self, state: _Source) -> dict[str, dict[_Sample, tuple[str, float]]]:
        """The source's counts as kept values (from its latest report, once)."""
        if state.counts is None:
            state.counts = {}
            self._merge(state, state.latest)
            state.latest = [f for f in state.latest if f[1] not in _COUNTS]
        return state.counts

    def _merge(self, state: _Source, families: list[Family]) -> None:
        assert state.counts is not None
        for name, kind, _, samples in families:
            for sample_name, labels, value in samples:
                meaning = _meaning(kind, name, sample_name)
                if meaning in ("count", "created"):
                    key = (sample_name, tuple(sorted(labels.items())))
                    self._raise(state.counts, name, key, meaning, value)

    @staticmethod
    def _raise(
        counts: dict[str, dict[_Sample, tuple[str, float]]],
        name: str,
        key: _Sample,
        meaning: str,
        value: float,
    ) -> None:
        family = counts.setdefault(name, {})
        old = family.get(key)
        if old is None:
            family[key] = (meaning, value)
        elif meaning == "created":
            family[key] = (meaning, min(old[1], value))
        elif value > old[1]:
            family[key] = (meaning, value)

    def retire(self, source: Hashable) -> None:
        """The source is gone: its counts stay counted, its gauges go."""
        state = self._source(source)
        self._frozen(state)
        state.live = False
        state.latest = []

    def raise_to(
        self,
        source: Hashable,
        family: str,
        kind: str,
        doc: str,
        samples: Iterable[tuple[str, dict[str, str], float]],
    ) -> None:
        """Counts ``source`` made that its reports may not show (a dead worker's
        final values): each sample is raised to at least this."""
        self._meta.setdefault(family, (kind, doc))
        counts = self._frozen(self._source(source))
        for sample_name, labels, value in samples:
            key = (sample_name, tuple(sorted(labels.items())))
            self._raise(counts, family, key, _meaning(kind, family, sample_name), value)

    def families(self) -> list[Family]:
        combined: dict[str, dict[_Sample, float]] = {name: {} for name in self._meta}
        latest: dict[tuple[str, _Sample], int] = {}
        for state in self._sources.values():
            for name, samples in (state.counts or {}).items():
                into = combined[name]
                for key, (meaning, value) in samples.items():
                    self._add(into, key, meaning, value)
            for name, kind, _, rows in state.latest:
                into = combined[name]
                for sample_name, labels, value in rows:
                    meaning = _meaning(kind, name, sample_name)
                    key = (sample_name, tuple(sorted(labels.items())))
                    if meaning in ("count", "created"):
                        self._add(into, key, meaning, value)
                    elif key in into and meaning == "additive":
                        into[key] += value
                    elif key not in into or state.order > latest[(name, key)]:
                        into[key] = value
                        latest[(name, key)] = state.order
        return [
            [name, kind, doc, [[sample, dict(labels), value] for (sample, labels), value in rows]]
            for name, (kind, doc) in self._meta.items()
            for rows in (combined[name].items(),)
        ]

    @staticmethod
    def _add(into: dict[_Sample, float], key: _Sample, meaning: str, value: float) -> None:
        if key not in into:
            into[key] = value
        elif meaning == "created":
            into[key] = min(into[key], value)
        else:
            into[key] += value
