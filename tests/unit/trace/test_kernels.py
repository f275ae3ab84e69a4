"""The compiled inner loops, called directly: prefix fingerprints equal exactly
when salt, length and prefix are equal, and the LRU pass gives every full block
the capacity it needs, as a plain LRU stack replay of SPEC 10's model does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.trace.kernels import lru_profile, prefix_fingerprints


def fingerprints(prompts, block, *, partial=False, salts=None):
    tokens = np.array([t for p in prompts for t in p], np.uint32)
    lengths = np.array([len(p) for p in prompts], np.int64)
    salts = np.array(salts or [0] * len(prompts), np.uint64)
    return prefix_fingerprints(tokens, lengths, salts, block, partial)


def keys(prompts, block, **kwargs):
    lane1, lane2, counts = fingerprints(prompts, block, **kwargs)
    pairs = list(zip(lane1.tolist(), lane2.tolist(), strict=True))
    out, at = [], 0
    for count in counts.tolist():
        out.append(pairs[at : at + count])
        at += count
    return out


def stack_replay(prompts, block):
    """SPEC 10 by hand: depth of each block in an LRU stack at its request's arrival,
    the running maximum over the leading blocks, then the blocks touched leaf first."""
    stack: list[tuple] = []  # most recent first
    hist = [0] * (sum(len(p) // block for p in prompts) + 2)
    for prompt in prompts:
        blocks = [tuple(prompt[: (k + 1) * block]) for k in range(len(prompt) // block)]
        running = 0
        for key in blocks:
            depth = stack.index(key) + 1 if key in stack else -1
            if running >= 0:
                running = -1 if depth < 0 else max(running, depth)
            hist[max(running, 0)] += 1
        for key in reversed(blocks):
            if key in stack:
                stack.remove(key)
            stack.insert(0, key)
    return hist


class TestFingerprints:
    """Equal exactly when (salt, length, prefix) are equal."""

    def test_counts_and_partial_blocks(self):
        _, _, counts = fingerprints([[1, 2, 3], [1, 2, 3, 4], []], 2)
        assert counts.tolist() == [1, 2, 0]
        lane1, _, counts = fingerprints([[1, 2, 3], [1, 2, 3, 4], []], 2, partial=True)
        assert counts.tolist() == [2, 2, 0] and lane1.size == 4

    def test_shared_prefix_shares_leading_blocks(self):
        a, b = keys([[1, 2, 3, 4], [1, 2, 9, 9]], 2)
        assert a[0] == b[0] and a[1] != b[1]

    def test_a_prefix_and_its_partial_block_differ(self):
        full, short = keys([[1, 2, 3, 4], [1, 2, 3]], 2, partial=True)
        assert short[0] == full[0] and short[1] != full[1]

    def test_position_and_salt_matter(self):
        a, b = keys([[1, 2, 3, 4], [3, 4, 1, 2]], 2)
        assert a[1] != b[1]
        plain, salted = keys([[1, 2], [1, 2]], 2, salts=[0, 5])
        assert plain != salted

    @given(st.lists(st.lists(st.integers(0, 3), max_size=8), min_size=1, max_size=8))
    @settings(max_examples=60, deadline=None)
    def test_equal_exactly_when_prefixes_equal(self, prompts):
        prefix_of: dict = {}
        key_of: dict = {}
        for prompt, blocks in zip(prompts, keys(prompts, 2, partial=True), strict=True):
            for k, key in enumerate(blocks):
                prefix = tuple(prompt[: min((k + 1) * 2, len(prompt))])
                assert prefix_of.setdefault(key, prefix) == prefix
                assert key_of.setdefault(prefix, key) == key


class TestLruProfile:
    """The capacity each full block needs to be a hit."""

    def profile(self, prompts, block=2):
        lane1, lane2, counts = fingerprints(prompts, block)
        return lru_profile(lane1, lane2, counts).tolist()

    def test_by_hand(self):
        # R1: both blocks new. R2: root at depth 1 (touched last), leaf at depth 2.
        assert self.profile([[1, 2, 3, 4], [1, 2, 3, 4]]) == [2, 1, 1, 0, 0, 0]

    def test_a_missed_root_makes_every_block_a_miss(self):
        assert self.profile([[1, 2, 3, 4], [9, 9, 3, 4]]) == [4, 0, 0, 0, 0, 0]

    def test_other_requests_push_blocks_down(self):
        assert self.profile([[1, 2], [3, 4], [5, 6], [1, 2]])[3] == 1

    def test_empty(self):
        assert self.profile([]) == [0, 0]

    @given(st.lists(st.lists(st.integers(0, 2), max_size=8), min_size=1, max_size=12))
    @settings(max_examples=80, deadline=None)
    def test_as_a_plain_lru_stack(self, prompts):
        assert self.profile(prompts) == stack_replay(prompts, 2)

    def test_grows_its_table(self):
        prompts = [list(range(i, i + 8)) for i in range(0, 6000, 2)] * 2
        assert self.profile(prompts, 4) == stack_replay(prompts, 4)
