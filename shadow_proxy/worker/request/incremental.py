"""Exact incremental tokenization: reuse the ids of prompt segments already encoded.

Pure module (no aiohttp, no zmq). Built once per model when the tap worker loads its
tokenizers (``IncrementalEncoder.for_tokenizer``) and called for every prompt it encodes;
single-threaded like the worker's loop. Guarantee: ``encode(text)`` returns exactly
``tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids`` for every text.
When that cannot be proven for a tokenizer, ``fallback_reason`` says why and every text
is encoded in full (still correct, just not incremental).

Why the cut is exact is ``segments.py``'s docstring (the argument, point by point,
from the library's own source); what the cache holds and how its bound is measured,
``segment_cache.py``'s.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable
from typing import Any

import attrs
import msgpack

from shadow_proxy.worker.request.segment_cache import DEFAULT_MAX_BYTES, IDS, SegmentCache
from shadow_proxy.worker.request.segments import NotSegmentable, Segmenter, probe

#: The assistant message ``IncrementalEncoder.learn_answer_gap`` renders.
_ANSWER_MARKER = "shadowproxyanswermarker"


class TokenIds(list):
    """A prompt's ids (``encode_turn``), and their MessagePack: an array's items,
    without its header (``packed`` adds it). Made once, never changed."""

    __slots__ = ("items",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.items = b""

    def packed(self) -> bytes:
        """The ids as ``msgpack.packb`` packs the list."""
        n = len(self)
        if n < 16:
            return bytes((0x90 | n,)) + self.items
        if n < 1 << 16:
            return b"\xdc" + n.to_bytes(2, "big") + self.items
        return b"\xdd" + n.to_bytes(4, "big") + self.items


def _items(ids: list[int]) -> bytes:
    """The MessagePack items of ``ids`` (the array without its header)."""
    packed = msgpack.packb(ids)
    n = len(ids)
    return packed[1 if n < 16 else 3 if n < 1 << 16 else 5 :]


@attrs.frozen
class Resume:
    """Where the scan of a prompt restarted: after each cut token it matched, the
    character offset, the ids before it and their MessagePack's length; and the
    prompt's ids."""

    ids: TokenIds
    points: list[tuple[int, int, int]]


@attrs.define
class IncrementalEncoder:
    """Encodes prompts, reusing the ids of segments seen before; exact or full."""

    tokenizer: Any
    segmenter: Segmenter | None
    cache: SegmentCache
    #: Why segments are not used for this tokenizer (None when they are).
    fallback_reason: str | None = None
    #: Tokens returned, and those of them the tokenizer had to produce (the rest came
    #: from the cache or were added tokens): 1 - encoded / returned is the saving.
    returned_tokens: int = 0
    encoded_tokens: int = 0
    #: The text around an assistant message's content in the gap or piece that
    #: holds it when the template renders it (``learn_answer_gap``); None: unknown,
    #: answers are not kept.
    answer_prefix: str | None = None
    answer_suffix: str = ""

    def learn_answer_gap(self, render: Callable[[dict[str, Any]], str]) -> None:
        """Where the chat template puts an answer: render a conversation whose
        assistant message is a marker and find the piece that holds it (DeepSeek:
        the marker alone; ChatML: ``"assistant\\n"`` before it). A template that
        fails, or renders the marker other than once inside one piece, keeps
        answers out of the cache."""
        self.answer_prefix = None
        if self.segmenter is None:
            return
        messages = [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": _ANSWER_MARKER},
            {"role": "user", "content": "next question"},
        ]
        try:
            text = render({"messages": messages})
        except Exception:  # any template failure: no answers kept, nothing else lost
            return
        if text.count(_ANSWER_MARKER) != 1:
            return
        for piece in self.segmenter.split(text):
            if type(piece) is str and _ANSWER_MARKER in piece:
                self.answer_prefix, _, self.answer_suffix = piece.partition(_ANSWER_MARKER)
                return

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> IncrementalEncoder:
        """Check the tokenizer (and probe it); fall back to full encodes if unproven."""
        cache = SegmentCache(max_bytes)
        try:
            segmenter = Segmenter.for_tokenizer(tokenizer)
            probe(tokenizer, segmenter)
        except NotSegmentable as e:
            return cls(tokenizer, None, cache, fallback_reason=str(e))
        return cls(tokenizer, segmenter, cache)

    def encode(self, text: str, *, counted: bool = True) -> list[int]:
        """Token ids of ``text`` without special tokens, identical to a full encode.
        ``counted=False``: a part of a prompt encoded again (``prompt_spans``), left out
        of ``returned_tokens``/``encoded_tokens``, the prompt-token metrics."""
        return self.encode_many([text], counted=counted)[0]

    def encode_output(self, text: str, *, conversation: bool = True) -> list[int]:
        """A full encode of ``text`` (an answer's output). The piece the next turn
        renders it into (``answer_prefix + text + answer_suffix``) is kept too:
        that turn resends the answer as an assistant message. Exact whatever the
        text: a gap or piece equal to the key encodes alone to these very ids
        (module docstring, point 2), and any other text is another key.

        When the prefix and suffix are empty (DeepSeek) the one encode serves
        both. Otherwise (ChatML) the piece is a second encode, worth it only if a
        next turn is likely: ``conversation`` (the request named its session, so
        that turn also comes to this shard) says so."""
        encode = self.tokenizer.encode_batch_fast
        prefix, suffix = self.answer_prefix, self.answer_suffix
        if prefix is None or not text or ((prefix or suffix) and not conversation):
            return encode([text], add_special_tokens=False)[0].ids
        if prefix or suffix:
            ids, piece_ids = (
                e.ids for e in encode([text, prefix + text + suffix], add_special_tokens=False)
            )
        else:
            ids = piece_ids = encode([text], add_special_tokens=False)[0].ids
        self.cache.put(prefix + text + suffix, array(IDS, piece_ids))
        return ids

    def encode_turn(
        self, text: str, previous: Resume | None = None, shared: int = 0
    ) -> tuple[list[int], Resume | None]:
        """``encode(text)`` (a ``TokenIds`` with its MessagePack), and where its scan
        restarted (None without a segmenter).

        ``previous``: the ``Resume`` of a text whose first ``shared`` characters
        ``text`` shares (the conversation's previous prompt). Its pieces before
        the last point where its scan restarted, at least the longest cut token
        before ``shared``, are taken as they were, with their ids: the scan of
        ``text`` makes the same matches up to there (each decided on the next
        ``longest_raw`` characters, which the two texts share) and restarts
        there too (``segments.py``, point 3). Only the rest is scanned."""
        segmenter = self.segmenter
        if segmenter is None:
            return self.encode(text), None
        start = kept = kept_bytes = 0
        points: list[tuple[int, int, int]] = []
        if previous is not None:
            limit = (shared - segmenter.longest_raw, math.inf, math.inf)
            at = bisect.bisect_right(previous.points, limit)
            if at:
                points = previous.points[:at]
                start, kept, kept_bytes = points[-1]
        pieces, ends = segmenter.split_raw_from(text, start)
        found = self._encode_gaps([pieces], counted=True)
        out = self._assemble(pieces, found)
        self.returned_tokens += kept + len(out)
        tail = out.tolist()
        # The ids' MessagePack, the tail's packed between its points: a point's
        # offset in it is where a later prompt's kept ids end.
        items = [previous.ids.items[:kept_bytes]] if previous is not None and kept else []
        size, count, last = kept_bytes, kept, 0
        matches = iter(ends)
        for piece in pieces:
            if type(piece) is str:
                count += len(found[piece])
            else:
                count += 1
                packed = _items(tail[last : count - kept])
                items.append(packed)
                size += len(packed)
                last = count - kept
                points.append((next(matches), count, size))
        items.append(_items(tail[last:]))
        ids = TokenIds(previous.ids[:kept]) if previous is not None and kept else TokenIds()
        ids += tail
        ids.items = b"".join(items)
        return ids, Resume(ids, points)

    def encode_many(self, texts: list[str], *, counted: bool = True) -> list[list[int]]:
        """``encode`` of each text; the segments nobody has seen go to the tokenizer in
        one batch call, which runs on its Rust threads without the GIL."""
        if self.segmenter is None:
            encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            result = [encoding.ids for encoding in encodings]
            if counted:
                total = sum(map(len, result))
                self.encoded_tokens += total
                self.returned_tokens += total
            return result
        all_gaps = [self.segmenter.split_raw(text) for text in texts]
        found = self._encode_gaps(all_gaps, counted=counted)
        result = []
        for gaps in all_gaps:
            out = self._assemble(gaps, found)
            if counted:
                self.returned_tokens += len(out)
            result.append(out.tolist())
        return result

    def _encode_gaps(self, all_gaps: list[list[str | int]], *, counted: bool) -> dict[str, array]:
        """The ids of every gap in ``all_gaps``: from the cache, or encoded (the new
        ones, in one batch call) and cached."""
        # Two levels: a gap of the first cut (at non-normalized tokens) is looked up
        # whole, and only when it is new is it cut again at the normalized ones
        # (whose pieces are looked up or encoded, and the gap stored with their
        # ids). The gap's ids are its pieces' ids either way (module docstring,
        # point 2); the second cut, a regex scan of the text without a literal
        # prefix, is then paid for the new turns only.
        segmenter = self.segmenter
        assert segmenter is not None
        cache = self.cache
        found: dict[str, array] = {}
        #: Each new first-cut gap, with its pieces.
        new_gaps: dict[str, list[str | int]] = {}
        missing: list[str] = []

        def look_up(piece: str) -> bool:
            if piece in found:
                return True
            ids = cache.get(piece)
            if ids is None:
                return False
            found[piece] = ids
            return True

        for gaps in all_gaps:
            for gap in gaps:
                if type(gap) is not str or gap in new_gaps or look_up(gap):
                    continue
                pieces = segmenter.split_normalized(gap)
                new_gaps[gap] = pieces
                for piece in pieces:
                    if type(piece) is str and not look_up(piece):
                        missing.append(piece)
                        found[piece] = array(IDS)  # filled below
        if missing:
            encodings = self.tokenizer.encode_batch_fast(missing, add_special_tokens=False)
            for piece, encoding in zip(missing, encodings, strict=True):
                ids = found[piece]
                ids.extend(encoding.ids)
                if counted:
                    self.encoded_tokens += len(ids)
                cache.put(piece, ids)
        for gap, pieces in new_gaps.items():
            if len(pieces) == 1 and pieces[0] == gap:
                continue  # stored above, as its own piece
            ids = self._assemble(pieces, found)
            found[gap] = ids
            cache.put(gap, ids)
        return found

    @staticmethod
    def _assemble(gaps: list[str | int], found: dict[str, array]) -> array:
        """The ids of pieces (ids, or texts ``found`` holds), in order: a text's from
        its first-cut gaps, or a gap's from its second-cut pieces."""
        out = array(IDS)
        for gap in gaps:
            if isinstance(gap, int):
                out.append(gap)
            else:
                out.extend(found[gap])
        return out
