"""Metric families from processes that come and go, summed, counters never backwards.

Pure. Families travel as plain data (``control.Family``: name, type,
documentation, samples ``[sample_name, labels, value]``). ``Totals`` keeps the
latest families of each source (a shard of the tap worker in the worker's
main; the worker itself in the serving process) and yields their sum. When a
source is replaced (it died, or was recycled), ``retire`` moves its last
counter values into a base that is added from then on, so a counter never
goes backwards; gauges of a retired source simply disappear. A counter's
increments between the source's last snapshot and its death are lost (at most
one snapshot interval), unless the caller knows the final values and passes
them with ``add``. A ``*_created`` sample is a timestamp, not a count, and is
never summed: the earliest any source reported stands (retired sources
included, since the total still holds their counts).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from shadow_proxy.channel.control import Family

#: Family types whose samples only grow.
_GROWING = frozenset({"counter", "histogram", "summary"})

_Key = tuple[str, str, tuple[tuple[str, str], ...]]


def _is_created(sample_name: str) -> bool:
    return sample_name.endswith("_created")


def _grows(kind: str, sample_name: str) -> bool:
    return kind in _GROWING and not _is_created(sample_name)


class Totals:
    """The sum of every source's latest families, plus what retired sources counted."""

    def __init__(self) -> None:
        self._current: dict[Hashable, list[Family]] = {}
        self._base: dict[_Key, float] = {}
        #: The earliest ``*_created`` value seen per sample.
        self._created: dict[_Key, float] = {}
        #: name -> (type, documentation), in first-seen order.
        self._meta: dict[str, tuple[str, str]] = {}

    def update(self, source: Hashable, families: list[Family]) -> None:
        self._current[source] = families
        for name, kind, doc, samples in families:
            self._meta.setdefault(name, (kind, doc))
            for sample_name, labels, value in samples:
                if _is_created(sample_name):
                    key = (name, sample_name, tuple(sorted(labels.items())))
                    self._created[key] = min(value, self._created.get(key, value))

    def retire(self, source: Hashable, keep: Callable[[str], bool] = lambda name: True) -> None:
        """The source is gone: its counters (of the families ``keep`` accepts) stay
        counted; everything else it reported is forgotten."""
        for name, kind, _, samples in self._current.pop(source, []):
            if not keep(name):
                continue
            for sample_name, labels, value in samples:
                if _grows(kind, sample_name):
                    self._add_base(name, sample_name, labels, value)

    def add(self, family: str, kind: str, doc: str, samples: Iterable[tuple[str, dict, float]]):
        """Add counts a retired source made that its snapshots did not show."""
        self._meta.setdefault(family, (kind, doc))
        for sample_name, labels, value in samples:
            self._add_base(family, sample_name, labels, value)

    def _add_base(self, family: str, sample_name: str, labels: dict, value: float) -> None:
        key = (family, sample_name, tuple(sorted(labels.items())))
        self._base[key] = self._base.get(key, 0) + value

    def families(self) -> list[Family]:
        sums: dict[str, dict[tuple[str, tuple], float]] = {name: {} for name in self._meta}
        for (family, sample_name, labels), value in self._base.items():
            sums[family][(sample_name, labels)] = value
        for families in self._current.values():
            for name, _, _, samples in families:
                into = sums[name]
                for sample_name, labels, value in samples:
                    key = (sample_name, tuple(sorted(labels.items())))
                    if _is_created(sample_name):
                        into[key] = self._created[(name, *key)]
                    else:
                        into[key] = into.get(key, 0) + value
        result: list[Family] = []
        for name, (kind, doc) in self._meta.items():
            samples: list[Any] = [
                [sample_name, dict(labels), value]
                for (sample_name, labels), value in sums[name].items()
            ]
            result.append([name, kind, doc, samples])
        return result
