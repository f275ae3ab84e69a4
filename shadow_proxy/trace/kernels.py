"""Compiled inner loops of shadow-trace: prefix fingerprints and the LRU stack pass.

Pure: numpy arrays in, numpy arrays out; no I/O. Compiled with numba on first use
(``cache=True`` keeps the machine code beside this file, so later runs start in
well under a second). Python loops here would run at about a tenth of a million
block touches per second; these run at several million on one core.

Guarantees:
- ``prefix_fingerprints`` gives every block a 128-bit fingerprint (two u64) of
  ``(salt, prefix length, every token of the prefix with its position)``: two
  blocks get equal fingerprints exactly when their salts, lengths and prefixes are
  equal, except with probability about 2**-128 per pair (a sum of murmur3-mixed
  64-bit words per lane, two lanes with independent constants).
- ``lru_profile`` replays SPEC 10's cache model exactly (see its docstring).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U64 = np.uint64
_M1 = _U64(0xFF51AFD7ED558CCD)
_M2 = _U64(0xC4CEB9FE1A85EC53)
_LANE1 = _U64(0x9E3779B97F4A7C15)
_LANE2 = _U64(0xD6E8FEB86659FD93)
_LEN1 = _U64(0xA0761D6478BD642F)
_LEN2 = _U64(0xE7037ED1A0B428DB)
_S33 = _U64(33)
_S32 = _U64(32)


@njit(cache=True, inline="always")
def _fmix64(x):
    """murmur3's 64-bit finalizer: a bijection with full avalanche."""
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


@njit(cache=True)
def prefix_fingerprints(tokens, lengths, salts, block_size, partial):
    """Fingerprints of each request's blocks, requests one after the other.

    ``tokens``: u32, the requests' token ids concatenated; ``lengths``: i64 per
    request; ``salts``: u64 per request (0 for none). Block k of a request covers
    its first ``min((k+1)*block_size, length)`` tokens; with ``partial`` false only
    full blocks are emitted. Returns ``(lane1, lane2, counts)``: u64 fingerprints in
    request order, block 0 first, and the number of blocks per request.
    """
    n = lengths.shape[0]
    counts = np.zeros(n, np.int64)
    total = 0
    for r in range(n):
        c = lengths[r] // block_size
        if partial and lengths[r] % block_size:
            c += 1
        counts[r] = c
        total += c
    lane1 = np.empty(total, np.uint64)
    lane2 = np.empty(total, np.uint64)
    offset = 0
    out = 0
    for r in range(n):
        length = lengths[r]
        salt = salts[r]
        acc1 = _U64(0)
        acc2 = _U64(0)
        for q in range(length):
            word = (_U64(q) << _S32) | _U64(tokens[offset + q])
            acc1 += _fmix64(word ^ _LANE1)
            acc2 += _fmix64((word + _LANE2) * _LANE1)
            end = q + 1
            if end % block_size == 0 or (partial and end == length):
                size = _U64(end)
                lane1[out] = _fmix64(acc1 ^ _fmix64(size * _LEN1 + salt))
                lane2[out] = _fmix64(acc2 + _fmix64((size ^ salt) * _LEN2 + _LANE2))
                out += 1
        offset += length
    return lane1, lane2, counts


@njit(cache=True)
def _find(keys1, keys2, mask, k1, k2):
    slot = np.int64(_fmix64(k1 ^ k2) & _U64(mask))
    while True:
        if keys1[slot] == k1 and keys2[slot] == k2:
            return slot
        if keys1[slot] == 0 and keys2[slot] == 0:
            return slot
        slot = (slot + 1) & mask


@njit(cache=True)
def lru_profile(lane1, lane2, counts):
    """Histogram of the LRU capacity (in blocks) each full block needs to be a hit.

    Requests arrive in the given order; request r owns ``counts[r]`` consecutive
    fingerprints, block 0 first. SPEC 10's model: a request's hit blocks are its
    leading blocks found in the cache when it arrives; then all its blocks are
    touched from the last to the first (leaf first). Block k's depth at arrival
    (its position in the LRU stack, 1 = most recent) is its stack distance when
    touched minus the k+1..n-1 blocks of the same request touched just before it.
    At capacity C block k is a hit exactly when the running maximum of the depths
    of blocks 0..k is at most C. Returns ``hist``: ``hist[0]`` counts blocks that
    never hit (first sight), ``hist[d]`` blocks whose needed capacity is ``d``.
    """
    total = lane1.shape[0]
    tree = np.zeros(total + 1, np.int32)  # Fenwick tree over touch times: 1 = latest touch
    hist = np.zeros(total + 2, np.int64)
    size = 4096
    keys1 = np.zeros(size, np.uint64)
    keys2 = np.zeros(size, np.uint64)
    last = np.full(size, -1, np.int64)
    used = 0
    longest = 0
    for r in range(counts.shape[0]):
        if counts[r] > longest:
            longest = counts[r]
    depth = np.empty(max(longest, 1), np.int64)
    now = 0
    base = 0
    for r in range(counts.shape[0]):
        n = counts[r]
        for j in range(n):
            k = n - 1 - j  # leaf first
            k1 = lane1[base + k]
            k2 = lane2[base + k]
            if k1 == 0 and k2 == 0:
                k2 = _U64(1)  # (0, 0) marks an empty slot
            if 2 * (used + 1) > size:
                size *= 2
                n1 = np.zeros(size, np.uint64)
                n2 = np.zeros(size, np.uint64)
                nl = np.full(size, -1, np.int64)
                for s in range(keys1.shape[0]):
                    if last[s] >= 0:
                        t = _find(n1, n2, size - 1, keys1[s], keys2[s])
                        n1[t] = keys1[s]
                        n2[t] = keys2[s]
                        nl[t] = last[s]
                keys1, keys2, last = n1, n2, nl
            slot = _find(keys1, keys2, size - 1, k1, k2)
            previous = last[slot]
            if previous < 0:
                keys1[slot] = k1
                keys2[slot] = k2
                used += 1
                depth[k] = -1
            else:
                # distinct blocks touched after `previous`: marks in (previous, now)
                s = 0
                i = now
                while i > 0:
                    s += tree[i]
                    i -= i & -i
                i = previous + 1
                while i > 0:
                    s -= tree[i]
                    i -= i & -i
                depth[k] = s + 1 - j  # minus this request's own blocks touched before it
                i = previous + 1
                while i <= total:
                    tree[i] -= 1
                    i += i & -i
            last[slot] = now
            i = now + 1
            while i <= total:
                tree[i] += 1
                i += i & -i
            now += 1
        # A block's ancestors are always more recent than it (each touch of it is
        # followed by touches of them), so depths rise along the chain and this
        # running maximum only guards the rule "all of blocks 0..k must be hits".
        running = 0
        for k in range(n):
            if running >= 0:
                if depth[k] < 0:
                    running = -1
                elif depth[k] > running:
                    running = depth[k]
            hist[running if running > 0 else 0] += 1
        base += n
    return hist
