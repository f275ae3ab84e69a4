"""The segment cache: least recently used first out, bounded in bytes as counted and as
measured."""

from __future__ import annotations

import random
import tracemalloc
from array import array

from shadow_proxy.worker.request.segment_cache import SegmentCache


class TestSegmentCache:
    """LRU by bytes; the bound holds as counted and as measured by tracemalloc."""

    def test_least_recently_used_goes_first(self):
        one = SegmentCache.cost("a", array("I", [1]))
        cache = SegmentCache(max_bytes=3 * one, max_entry_bytes=one)
        for key in "abc":
            cache.put(key, array("I", [1]))
        assert cache.get("a") is not None  # a is now the most recent
        cache.put("d", array("I", [1]))
        assert cache.get("b") is None
        assert [cache.get(k) is not None for k in "acd"] == [True, True, True]
        assert cache.size_bytes <= cache.max_bytes
        assert cache.evictions == 1

    def test_oversized_entries_are_not_kept(self):
        cache = SegmentCache(max_bytes=10_000)
        cache.put("x" * 5_000, array("I", range(100)))
        assert len(cache) == 0
        assert cache.size_bytes == 0

    def test_memory_measured_within_bound(self):
        """Entries made and handed over as the encoder does (the cache holds the only
        reference): what tracemalloc sees held stays within ``max_bytes``."""
        max_bytes = 1024 * 1024
        rng = random.Random(7)
        cache = SegmentCache(max_bytes=max_bytes)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(6_000):
                size = rng.choice((1, 8, 60, 400))
                key = "".join(rng.choice("abcdé日😀 \n") for _ in range(size)) + str(i)
                cache.put(key, array("I", range(rng.randint(0, size))))
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert cache.evictions > 0
        assert cache.size_bytes <= max_bytes
        assert held <= max_bytes, (held, cache.size_bytes, len(cache))
