"""Prefix-cache reuse of a trace: the exact LRU hit-rate curve at every capacity.

Pure. ``ReuseAnalysis.add`` runs once per selected request (any order); ``result``
orders the requests by arrival and replays SPEC 10's cache model once per block
size and scope (each model, and all models in one cache):

- a block is identified by its whole prefix (and its model: two models never
  share a block); only full blocks are cached; capacity is counted in blocks;
- a request's hit tokens are B times the number of its leading full blocks found
  in the cache when it arrives;
- then all its full blocks are touched from the last to the first.

One pass (``kernels.lru_profile``, Mattson's stack distances with a Fenwick tree)
gives, for every full block, the smallest LRU capacity at which it is a hit; the
hit-rate curve is the cumulative sum of that histogram, so it is exact at every
capacity, not sampled. Memory: 16 bytes per full block per block size while
collecting, about 40 more per block of the block size being replayed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np
import xxhash

from shadow_proxy.trace import kernels
from shadow_proxy.trace.blocks import check_block_size
from shadow_proxy.trace.selection import TraceRequest

DEFAULT_BLOCK_SIZES = (16, 64, 512)
PERCENTILES = (50, 90, 99)
ALL = "*"
_BATCH_TOKENS = 1 << 21


def parse_block_sizes(text: str) -> tuple[int, ...]:
    """``"16,64,512"`` -> ``(16, 64, 512)``; ValueError naming the bad item."""
    sizes = []
    for item in text.split(","):
        try:
            value = int(item.strip())
        except ValueError:
            value = 0
        if value < 1:
            msg = f"'--block-size' takes positive integers separated by commas (got {item!r})"
            raise ValueError(msg)
        sizes.append(value)
    return tuple(dict.fromkeys(sizes))


@attrs.frozen
class ReuseCurve:
    """Reuse of one scope at one block size.

    ``hist[0]``: full blocks never hit; ``hist[d]`` (d >= 1): full blocks that are
    hits exactly when the LRU cache holds at least ``d`` blocks.
    """

    block_size: int
    requests: int
    prompt_tokens: int
    hist: np.ndarray

    @property
    def full_blocks(self) -> int:
        return int(self.hist.sum())

    def hit_tokens(self, capacity: int | None = None) -> int:
        """Hit tokens at ``capacity`` blocks (None: an infinite cache)."""
        hits = self.hist[1:] if capacity is None else self.hist[1 : capacity + 1]
        return self.block_size * int(hits.sum())

    def hit_rate(self, capacity: int | None = None) -> float:
        return self.hit_tokens(capacity) / self.prompt_tokens if self.prompt_tokens else 0.0

    def lru_points(self) -> list[list[float]]:
        """``[capacity_blocks, hit_rate]`` where the curve changes; the rate at any
        capacity is that of the last point at or below it (0 before the first)."""
        capacities = np.flatnonzero(self.hist[1:]) + 1
        if not capacities.size or not self.prompt_tokens:
            return []
        cumulative = np.cumsum(self.hist[1:])[capacities - 1] * self.block_size
        rates = cumulative / self.prompt_tokens
        return [[int(c), float(r)] for c, r in zip(capacities, rates, strict=True)]

    def reuse_distance(self, percentile: float) -> int | None:
        """The capacity (blocks) that holds ``percentile`` % of the infinite cache's
        hits: a percentile of the reuse distances of the blocks that are ever hit."""
        hits = np.cumsum(self.hist[1:])
        if not hits.size or hits[-1] == 0:
            return None
        need = percentile / 100 * hits[-1]
        return int(np.searchsorted(hits, need, side="left")) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "full_blocks": self.full_blocks,
            "hit_rate_infinite": self.hit_rate(),
            "reuse_distance_blocks": {f"p{p}": self.reuse_distance(p) for p in PERCENTILES},
            "lru": self.lru_points(),
        }


@attrs.define
class _Collected:
    """Fingerprints of every request's full blocks at one block size."""

    lane1: list[np.ndarray] = attrs.field(factory=list)
    lane2: list[np.ndarray] = attrs.field(factory=list)
    counts: list[np.ndarray] = attrs.field(factory=list)


@attrs.define
class ReuseAnalysis:
    """Collects requests, then computes the curves."""

    block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES
    _collected: dict[int, _Collected] = attrs.field(init=False)
    _models: dict[str, int] = attrs.field(factory=dict, init=False)
    _arrival: list[int] = attrs.field(factory=list, init=False)
    _model: list[int] = attrs.field(factory=list, init=False)
    _length: list[int] = attrs.field(factory=list, init=False)
    _batch: list[np.ndarray] = attrs.field(factory=list, init=False)
    _batch_salts: list[int] = attrs.field(factory=list, init=False)
    _batch_tokens: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        for size in self.block_sizes:
            check_block_size(size)
        self._collected = {size: _Collected() for size in self.block_sizes}

    def add(self, request: TraceRequest) -> None:
        model = self._models.setdefault(request.model, len(self._models))
        self._arrival.append(request.arrival_unix_ns)
        self._model.append(model)
        self._length.append(request.input_length)
        self._batch.append(request.token_ids)
        self._batch_salts.append(xxhash.xxh3_64_intdigest(request.model.encode()))
        self._batch_tokens += request.input_length
        if self._batch_tokens >= _BATCH_TOKENS:
            self._flush()

    def extend(self, requests: Iterable[TraceRequest]) -> None:
        for request in requests:
            self.add(request)

    def _flush(self) -> None:
        if not self._batch:
            return
        tokens = np.concatenate(self._batch)
        lengths = np.array([t.size for t in self._batch], np.int64)
        salts = np.array(self._batch_salts, np.uint64)
        for size, store in self._collected.items():
            lane1, lane2, counts = kernels.prefix_fingerprints(tokens, lengths, salts, size, False)
            store.lane1.append(lane1)
            store.lane2.append(lane2)
            store.counts.append(counts)
        self._batch.clear()
        self._batch_salts.clear()
        self._batch_tokens = 0

    @property
    def requests(self) -> int:
        return len(self._arrival)

    def result(self) -> dict[str, dict[int, ReuseCurve]]:
        """Curves per scope (``ALL`` and each model name), per block size."""
        self._flush()
        arrival = np.array(self._arrival, np.int64)
        order = np.argsort(arrival, kind="stable")
        model = np.array(self._model, np.int64)[order]
        length = np.array(self._length, np.int64)[order]
        scopes: dict[str, np.ndarray | None] = {ALL: None}
        if len(self._models) > 1:
            for name, index in self._models.items():
                scopes[name] = model == index
        out: dict[str, dict[int, ReuseCurve]] = {name: {} for name in scopes}
        for size, store in self._collected.items():
            lane1, lane2, counts = _in_order(store, order)
            for name, chosen in scopes.items():
                if chosen is None:
                    hist = kernels.lru_profile(lane1, lane2, counts)
                    requests, tokens = len(length), int(length.sum())
                else:
                    touched = np.repeat(chosen, counts)
                    hist = kernels.lru_profile(lane1[touched], lane2[touched], counts[chosen])
                    requests, tokens = int(chosen.sum()), int(length[chosen].sum())
                hist = np.trim_zeros(hist, "b") if hist[1:].any() else hist[:1]
                out[name][size] = ReuseCurve(size, requests, tokens, hist)
        if len(self._models) == 1:
            out[next(iter(self._models))] = out[ALL]
        return out


def _in_order(store: _Collected, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The collected fingerprints with the requests put in ``order``."""
    empty = np.zeros(0, np.uint64)
    lane1 = np.concatenate(store.lane1) if store.lane1 else empty
    lane2 = np.concatenate(store.lane2) if store.lane2 else empty
    counts = np.concatenate(store.counts) if store.counts else np.zeros(0, np.int64)
    if np.all(order[1:] > order[:-1]):
        return lane1, lane2, counts
    starts = np.cumsum(counts) - counts
    new_counts = counts[order]
    new_starts = np.cumsum(new_counts) - new_counts
    index = np.repeat(starts[order] - new_starts, new_counts) + np.arange(new_counts.sum())
    return lane1[index], lane2[index], new_counts


def to_json(result: dict[str, dict[int, ReuseCurve]]) -> dict[str, Any]:
    """SPEC 10's JSON: per scope, per block size (keys are strings, as JSON wants)."""
    return {
        "all": {str(size): curve.to_json() for size, curve in result[ALL].items()},
        "models": {
            name: {str(size): curve.to_json() for size, curve in curves.items()}
            for name, curves in result.items()
            if name != ALL
        },
    }
