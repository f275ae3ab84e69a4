"""Block identities of a prompt: Mooncake hash ids and Dynamo's sequence hashes.

Pure: token ids in, integers out. Called once per request by the exporters and by
the reuse analysis; holds no I/O.

- ``dynamo_sequence_hashes`` is what Dynamo's request trace puts in
  ``replay.input_sequence_hashes`` (``lib/llm/src/request_trace/replay.rs``, which
  calls the kv-router's ``compute_block_hash_for_seq`` and
  ``compute_seq_hash_for_block``): each block of ``block_size`` tokens is hashed
  with xxh3-64, seed 1337, over its token ids as u32 little-endian; a partial last
  block is hashed the same way; the first block's sequence hash IS its block hash
  (it is chained with nothing); block i > 0 gets
  xxh3-64(le64(sequence hash i-1) + le64(block hash i), seed 1337).
- ``MooncakeIds`` numbers blocks as SPEC 10 says: block i of two requests gets the
  same id exactly when their first ``min((i+1)*B, length)`` tokens are equal (a
  partial last block is thus its own block, never the full block it begins);
  ids are 0, 1, 2... in order of first appearance, so feed requests in arrival
  order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import attrs
import numpy as np
import xxhash

from shadow_proxy.trace import kernels

DYNAMO_SEED = 1337
_CHAIN = struct.Struct("<QQ")
_U32_MAX = 0xFFFFFFFF


class TokenError(ValueError):
    """Token ids that are not u32 integers."""


def token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a little-endian u32 array; ``TokenError`` if any is not a u32."""
    if isinstance(token_ids, np.ndarray) and token_ids.dtype == np.dtype("<u4"):
        return token_ids
    try:
        wide = np.asarray(token_ids)
    except (TypeError, ValueError, OverflowError) as exc:
        msg = f"'token_ids' must be integers in 0..{_U32_MAX} ({type(exc).__name__}: {exc})"
        raise TokenError(msg) from exc
    if wide.size and wide.dtype.kind not in "iu":
        msg = f"'token_ids' must be integers in 0..{_U32_MAX} (got {wide.dtype.name} values)"
        raise TokenError(msg)
    if wide.ndim != 1:
        msg = f"'token_ids' must be a flat list (got {wide.ndim} dimensions)"
        raise TokenError(msg)
    if wide.size and (int(wide.min()) < 0 or int(wide.max()) > _U32_MAX):
        bad = int(wide.min()) if int(wide.min()) < 0 else int(wide.max())
        msg = f"'token_ids' must be integers in 0..{_U32_MAX} (got {bad})"
        raise TokenError(msg)
    return wide.astype("<u4")


def check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        msg = f"'block_size' must be a positive integer (got {block_size!r})"
        raise ValueError(msg)
    return block_size


def dynamo_sequence_hashes(token_ids: Sequence[int] | np.ndarray, block_size: int) -> list[int]:
    """Dynamo's ``input_sequence_hashes``: ceil(len / block_size) chained u64 hashes."""
    check_block_size(block_size)
    data = token_array(token_ids).tobytes()
    step = 4 * block_size
    hashes: list[int] = []
    parent = None
    for start in range(0, len(data), step):
        block = xxhash.xxh3_64_intdigest(data[start : start + step], seed=DYNAMO_SEED)
        if parent is None:
            parent = block
        else:
            parent = xxhash.xxh3_64_intdigest(_CHAIN.pack(parent, block), seed=DYNAMO_SEED)
        hashes.append(parent)
    return hashes


def block_fingerprints(
    token_ids: Sequence[int] | np.ndarray, block_size: int, *, partial: bool, salt: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """128-bit fingerprints (two u64 lanes) of the blocks of one prompt, block 0 first.

    A fingerprint stands for ``(salt, the block's whole prefix)``; see ``kernels``.
    With ``partial`` a partial last block gets one too.
    """
    check_block_size(block_size)
    tokens = token_array(token_ids)
    lane1, lane2, _ = kernels.prefix_fingerprints(
        tokens,
        np.array([tokens.size], np.int64),
        np.array([salt], np.uint64),
        block_size,
        partial,
    )
    return lane1, lane2


@attrs.define
class MooncakeIds:
    """Assigns Mooncake ``hash_ids`` to the prompts of one trace, in arrival order."""

    block_size: int = attrs.field(validator=lambda _i, _a, v: check_block_size(v))
    _ids: dict[tuple[int, int], int] = attrs.field(factory=dict, init=False)

    def hash_ids(self, token_ids: Sequence[int] | np.ndarray) -> list[int]:
        """ceil(len / block_size) ids; new prefixes get the next free id."""
        return self.number(*block_fingerprints(token_ids, self.block_size, partial=True))

    def number(self, lane1: np.ndarray, lane2: np.ndarray) -> list[int]:
        """Ids of blocks given by their fingerprints (``block_fingerprints``, partial)."""
        ids = self._ids
        out = []
        for key in zip(lane1.tolist(), lane2.tolist(), strict=True):
            value = ids.get(key)
            if value is None:
                value = ids[key] = len(ids)
            out.append(value)
        return out

    @property
    def distinct(self) -> int:
        """How many distinct block ids have been given."""
        return len(self._ids)
