"""The shared latency buckets: sorted, from milliseconds to long generations."""

from __future__ import annotations

import itertools

from shadow_proxy.metrics import LATENCY_BUCKETS


def test_buckets_are_strictly_increasing() -> None:
    assert all(a < b for a, b in itertools.pairwise(LATENCY_BUCKETS))


def test_buckets_cover_milliseconds_to_twenty_minutes() -> None:
    assert LATENCY_BUCKETS[0] <= 0.005
    assert LATENCY_BUCKETS[-1] >= 20 * 60  # the default buckets stop at 10 s
