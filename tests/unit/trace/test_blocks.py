"""Block identities: Dynamo's chained xxh3 hashes and Mooncake's hash ids."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.trace.blocks import (
    MooncakeIds,
    TokenError,
    block_fingerprints,
    dynamo_sequence_hashes,
)


def _xxh(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=1337)


class TestDynamoSequenceHashes:
    """As lib/llm/src/request_trace/replay.rs computes them."""

    def test_by_hand(self):
        b0 = _xxh(struct.pack("<2I", 1, 2))
        b1 = _xxh(struct.pack("<2I", 3, 4))
        b2 = _xxh(struct.pack("<I", 5))  # the partial last block, hashed too
        s1 = _xxh(struct.pack("<2Q", b0, b1))
        s2 = _xxh(struct.pack("<2Q", s1, b2))
        # the first block's sequence hash is its block hash: chained with nothing
        assert dynamo_sequence_hashes([1, 2, 3, 4, 5], 2) == [b0, s1, s2]

    def test_shared_prefix_shares_leading_hashes(self):
        short = dynamo_sequence_hashes([1, 2, 3, 4], 2)
        longer = dynamo_sequence_hashes([1, 2, 3, 4, 5, 6], 2)
        assert len(short) == 2 and len(longer) == 3
        assert longer[:2] == short

    def test_same_block_at_another_position_differs(self):
        hashes = dynamo_sequence_hashes([1, 2, 1, 2], 2)
        assert hashes[0] != hashes[1]

    def test_partial_block_differs_from_the_full_block_it_starts(self):
        assert dynamo_sequence_hashes([1, 2, 3], 2)[1] != dynamo_sequence_hashes([1, 2, 3, 4], 2)[1]

    def test_lengths(self):
        assert dynamo_sequence_hashes([], 64) == []
        assert len(dynamo_sequence_hashes(list(range(131_072)), 64)) == 2048
        assert len(dynamo_sequence_hashes(list(range(65)), 64)) == 2

    def test_u32_little_endian(self):
        assert dynamo_sequence_hashes([0x01020304], 64) == [_xxh(b"\x04\x03\x02\x01")]

    @pytest.mark.parametrize("tokens", [[-1], [2**32], [2**70], ["a"], [1.5], [True], [[1, 2]]])
    def test_rejects_tokens_that_are_not_u32(self, tokens):
        with pytest.raises(TokenError, match="token_ids"):
            dynamo_sequence_hashes(tokens, 2)

    @pytest.mark.parametrize("size", [0, -1, 1.5, True])
    def test_rejects_bad_block_size(self, size):
        with pytest.raises(ValueError, match="block_size"):
            dynamo_sequence_hashes([1, 2], size)


class TestMooncakeIds:
    """Block i shares an id exactly when the first min((i+1)B, len) tokens are equal."""

    def test_by_hand(self):
        ids = MooncakeIds(2)
        assert ids.hash_ids([1, 2, 3, 4, 5]) == [0, 1, 2]
        assert ids.hash_ids([1, 2, 3, 4]) == [0, 1]
        assert ids.hash_ids([1, 2, 3]) == [0, 3]  # a partial block is its own block
        assert ids.hash_ids([1, 2, 3, 4, 5]) == [0, 1, 2]
        assert ids.hash_ids([9, 2]) == [4]
        assert ids.hash_ids([1, 2, 3, 4, 6]) == [0, 1, 5]
        assert ids.hash_ids([3, 4]) == [6]  # same block content, other prefix
        assert ids.distinct == 7

    def test_count_is_ceil(self):
        ids = MooncakeIds(512)
        assert len(ids.hash_ids(list(range(512)))) == 1
        assert len(ids.hash_ids(list(range(513)))) == 2
        assert ids.hash_ids([]) == []

    @settings(max_examples=150, deadline=None)
    @given(
        st.integers(1, 4),
        st.lists(st.lists(st.integers(0, 2), max_size=10), min_size=1, max_size=12),
    )
    def test_ids_equal_exactly_when_prefixes_equal(self, block, prompts):
        ids = MooncakeIds(block)
        seen: dict[tuple[int, ...], int] = {}
        for prompt in prompts:
            got = ids.hash_ids(prompt)
            assert len(got) == -(-len(prompt) // block)
            for i, value in enumerate(got):
                prefix = tuple(prompt[: min((i + 1) * block, len(prompt))])
                assert seen.setdefault(prefix, len(seen)) == value


class TestFingerprints:
    def test_salt_separates(self):
        a = block_fingerprints([1, 2, 3, 4], 2, partial=False, salt=1)
        b = block_fingerprints([1, 2, 3, 4], 2, partial=False, salt=2)
        assert a[0].tolist() != b[0].tolist()

    def test_full_blocks_only(self):
        lane1, _ = block_fingerprints([1, 2, 3], 2, partial=False)
        assert lane1.size == 1
