"""The segment cache: segment text -> token ids, least recently used out, bounded in bytes.

Pure. Memory: the cache holds at most ``max_bytes`` (default 64 MiB per model) as counted by
``SegmentCache.cost``: the key string's and the id array's ``sys.getsizeof`` plus
``ENTRY_OVERHEAD`` for the ordered dict's node; a test measures a full cache with
tracemalloc against that bound. Ids are kept as 4-byte unsigned ints. A gap of the
first cut that is cut again is kept beside its pieces (the next turn finds it whole),
within the same bound.
"""

from __future__ import annotations

import collections
import sys
from array import array

import attrs

#: Default bound of one model's segment cache, in bytes as ``SegmentCache.cost`` counts.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Bytes charged per cache entry on top of its key and ids: the OrderedDict's hash
#: table share and linked node. Measured with tracemalloc on CPython 3.11: 66-100
#: bytes per entry for 100 to 87,000 entries, 116 in a cache churning at its bound.
ENTRY_OVERHEAD = 160
#: Typecode of 4-byte unsigned ints on every platform CPython supports here.
IDS = "I" if array("I").itemsize == 4 else "L"


@attrs.define
class SegmentCache:
    """Segment text -> token ids; least recently used first out; bounded in bytes.

    The key is the segment text itself (no hash collisions possible). Entries that
    would cost more than ``max_entry_bytes`` are not kept.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_entry_bytes: int = attrs.field()
    size_bytes: int = attrs.field(default=0, init=False)
    hits: int = attrs.field(default=0, init=False)
    misses: int = attrs.field(default=0, init=False)
    evictions: int = attrs.field(default=0, init=False)
    _entries: collections.OrderedDict[str, array] = attrs.field(
        factory=collections.OrderedDict, init=False
    )

    @max_entry_bytes.default
    def _max_entry_default(self) -> int:
        return self.max_bytes // 8

    @staticmethod
    def cost(text: str, ids: array) -> int:
        return sys.getsizeof(text) + sys.getsizeof(ids) + ENTRY_OVERHEAD

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str) -> array | None:
        ids = self._entries.get(text)
        if ids is None:
            self.misses += 1
            return None
        self._entries.move_to_end(text)
        self.hits += 1
        return ids

    def put(self, text: str, ids: array) -> None:
        cost = self.cost(text, ids)
        if cost > self.max_entry_bytes or text in self._entries:
            return
        entries = self._entries
        while entries and self.size_bytes + cost > self.max_bytes:
            old_text, old_ids = entries.popitem(last=False)
            self.size_bytes -= self.cost(old_text, old_ids)
            self.evictions += 1
        entries[text] = ids
        self.size_bytes += cost
