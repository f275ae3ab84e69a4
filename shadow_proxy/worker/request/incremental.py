"""Exact incremental tokenization: reuse the ids of prompt segments already encoded.

Pure module (no aiohttp, no zmq). Built once per model when the tap worker loads its
tokenizers (``IncrementalEncoder.for_tokenizer``) and called for every prompt it encodes;
single-threaded like the worker's loop. Guarantee: ``encode(text)`` returns exactly
``tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids`` for every text.
When that cannot be proven for a tokenizer, ``fallback_reason`` says why and every text
is encoded in full (still correct, just not incremental).

Why cutting a prompt at its added tokens is exact (huggingface/tokenizers,
``tokenizers/src/tokenizer/mod.rs`` ``encode_single_sequence`` and
``tokenizers/src/tokenizer/added_vocabulary.rs`` ``extract_and_normalize``,
``find_matches``):

1. The raw text is first cut at the added tokens whose ``normalized`` flag is off: one
   Aho-Corasick scan, leftmost-longest, non-overlapping. Each match becomes its token
   id; nothing else ever reads it.
2. Each gap between two matches is then, on its own: normalized; cut again at the
   ``normalized`` added tokens (matched in the normalized gap); pre-tokenized piece by
   piece; and each resulting word goes to the model on its own. No step sees the text
   of another gap, so a gap encodes the same whether it stands alone or sits in a
   prompt, provided no step looks at where the gap sits. The checks below refuse
   every configuration where something does: ``lstrip``/``rstrip``/``single_word``
   on a cut token (they look at, or take, the neighbours' characters), a Metaspace
   pre-tokenizer with ``prepend_scheme: first`` (it reads the piece's offset in the
   original text), truncation or padding (they act on the whole encoding), a model
   with randomness (BPE dropout), ``encode_special_tokens`` (special tokens are not
   cut), a post-processor that could add ids, or any type not known to us.
3. A gap encoded alone has no non-normalized match inside it: any occurrence would be a
   complete occurrence in the prompt, starting before the next match, and the
   leftmost-longest scan would have reported it. So cutting here, with the same
   leftmost-longest rule (a trie regex: children tried before a token ends, so the
   longest token wins at the leftmost position), reproduces step 1 exactly. When the
   normalizer is the identity and the normalized tokens carry no flags either, the
   gaps are cut again at those tokens, which reproduces step 2's cut exactly.

Byte fallback, unknown-token fusing and the BPE word cache all act within one word, so
they need no condition. The reasoning holds for the ``tokenizers`` versions the project
allows (``pyproject.toml``); a probe at load time compares cut and full encodes on
strings built around every cut token, and the hypothesis tests in
``tests/unit/worker/request/test_incremental.py`` compare them on random multi-turn
prompts of both local models, so a change of the library's rules shows up as a fallback
or a failing test.

Memory: the cache holds at most ``max_bytes`` (default 64 MiB per model) as counted by
``SegmentCache.cost``: the key string's and the id array's ``sys.getsizeof`` plus
``ENTRY_OVERHEAD`` for the ordered dict's node; a test measures a full cache with
tracemalloc against that bound. Ids are kept as 4-byte unsigned ints. A gap of the
first cut that is cut again is kept beside its pieces (the next turn finds it whole),
within the same bound.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from array import array
from collections.abc import Callable
from typing import Any

import attrs

#: Default bound of one model's segment cache, in bytes as ``SegmentCache.cost`` counts.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Bytes charged per cache entry on top of its key and ids: the OrderedDict's hash
#: table share and linked node. Measured with tracemalloc on CPython 3.11: 66-100
#: bytes per entry for 100 to 87,000 entries, 116 in a cache churning at its bound.
ENTRY_OVERHEAD = 160
#: The assistant message ``IncrementalEncoder.learn_answer_gap`` renders.
_ANSWER_MARKER = "shadowproxyanswermarker"
#: Typecode of 4-byte unsigned ints on every platform CPython supports here.
_IDS = "I" if array("I").itemsize == 4 else "L"

_POSITION_FREE_PRE_TOKENIZERS = frozenset(
    {
        "Split",
        "ByteLevel",  # add_prefix_space acts on every piece alike
        "Whitespace",
        "WhitespaceSplit",
        "Punctuation",
        "Digits",
        "BertPreTokenizer",
        "CharDelimiterSplit",
        "UnicodeScripts",
    }
)
_KNOWN_NORMALIZERS = frozenset(
    {
        "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Replace",
        "Prepend", "BertNormalizer", "Precompiled", "Nmt", "ByteLevel",
    }
)  # fmt: skip
#: Post-processors that add nothing when ``add_special_tokens`` is false.
_QUIET_POST_PROCESSORS = frozenset(
    {"ByteLevel", "TemplateProcessing", "BertProcessing", "RobertaProcessing"}
)
_DETERMINISTIC_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})


class NotSegmentable(ValueError):
    """Cutting at added tokens is not provably exact for this tokenizer; says why."""


def _literal_regex(strings: list[str]) -> re.Pattern[str] | None:
    """A regex matching ``strings`` leftmost-longest, as the library's Aho-Corasick
    scan does: a trie whose children are tried before the token ending there."""
    root: dict[str, dict] = {}
    for text in strings:
        node = root
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}
    if not root:
        return None

    def render(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + render(child) for char, child in node.items() if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return re.compile(render(root))


@attrs.frozen
class Segmenter:
    """Cuts a text where the tokenizer itself cuts it: at added tokens."""

    #: Non-normalized added tokens (the library's first cut), and their ids.
    raw: re.Pattern[str] | None
    raw_ids: dict[str, int]
    #: Normalized added tokens, cut only when the normalizer is the identity.
    normalized: re.Pattern[str] | None
    normalized_ids: dict[str, int]

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> Segmenter:
        """The segmenter of a ``tokenizers.Tokenizer``; raises ``NotSegmentable``."""
        config = _pipeline(tokenizer)
        _check_pipeline(tokenizer, config)
        raw_tokens, normalized_tokens = [], []
        for token in tokenizer.get_added_tokens_decoder().values():
            if token.content:
                (normalized_tokens if token.normalized else raw_tokens).append(token)
        for token in raw_tokens:
            if token.lstrip or token.rstrip or token.single_word:
                msg = f"added token {token.content!r} strips or matches single words"
                raise NotSegmentable(msg)
        cut_normalized = _is_identity(config["normalizer"]) and not any(
            token.lstrip or token.rstrip or token.single_word for token in normalized_tokens
        )
        if not cut_normalized:
            normalized_tokens = []

        def ids(tokens: list) -> dict[str, int]:
            return {token.content: tokenizer.token_to_id(token.content) for token in tokens}

        raw_ids, normalized_ids = ids(raw_tokens), ids(normalized_tokens)
        return cls(
            raw=_literal_regex(list(raw_ids)),
            raw_ids=raw_ids,
            normalized=_literal_regex(list(normalized_ids)),
            normalized_ids=normalized_ids,
        )

    @property
    def cut_tokens(self) -> list[str]:
        return [*self.raw_ids, *self.normalized_ids]

    def split(self, text: str) -> list[str | int]:
        """The text as non-empty gaps (str) and added-token ids (int), in order."""
        result: list[str | int] = []
        for piece in self.split_raw(text):
            if type(piece) is str:
                result += self.split_normalized(piece)
            else:
                result.append(piece)
        return result

    def split_raw(self, text: str) -> list[str | int]:
        """The library's first cut only: at the non-normalized added tokens."""
        return _cut(text, self.raw, self.raw_ids)

    def split_normalized(self, gap: str) -> list[str | int]:
        """A gap of ``split_raw`` cut again at the normalized added tokens (itself
        when those are not cut): the pieces whose ids make up the gap's."""
        if self.normalized is None:
            return [gap]
        return _cut(gap, self.normalized, self.normalized_ids)


def _cut(text: str, pattern: re.Pattern[str] | None, ids: dict[str, int]) -> list[str | int]:
    """``text`` cut at the matches of ``pattern``: gaps as str, matches as their ids."""
    if pattern is None:
        return [text] if text else []
    pieces: list[str | int] = []
    start = 0
    for match in pattern.finditer(text):
        if match.start() > start:
            pieces.append(text[start : match.start()])
        pieces.append(ids[match.group()])
        start = match.end()
    if start < len(text):
        pieces.append(text[start:] if start else text)
    return pieces


def _pipeline(tokenizer: Any) -> dict[str, Any]:
    """The serialized normalizer, pre-tokenizer and post-processor (not the vocabulary)."""
    parts = {}
    for key in ("normalizer", "pre_tokenizer", "post_processor"):
        part = getattr(tokenizer, key)
        parts[key] = None if part is None else json.loads(part.__getstate__())
    return parts


def _check_pipeline(tokenizer: Any, config: dict[str, Any]) -> None:
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        raise NotSegmentable("truncation or padding is set")
    if getattr(tokenizer, "encode_special_tokens", False):
        raise NotSegmentable("encode_special_tokens is set: special tokens are not cut")
    model = type(tokenizer.model).__name__
    if model not in _DETERMINISTIC_MODELS:
        raise NotSegmentable(f"model type {model!r} is not known here")
    dropout = getattr(tokenizer.model, "dropout", None)
    if dropout not in (None, 0, 0.0):
        raise NotSegmentable(f"BPE dropout is {dropout} (random merges)")
    _check_tree(config["normalizer"], "normalizers", _KNOWN_NORMALIZERS, "normalizer")
    _check_tree(
        config["pre_tokenizer"], "pretokenizers", _POSITION_FREE_PRE_TOKENIZERS, "pre-tokenizer"
    )
    _check_tree(config["post_processor"], "processors", _QUIET_POST_PROCESSORS, "post-processor")


def _check_tree(node: Any, children: str, allowed: frozenset[str], what: str) -> None:
    if node is None:
        return
    kind = node.get("type")
    if kind == "Sequence":
        for child in node.get(children, []):
            _check_tree(child, children, allowed, what)
        return
    if what == "pre-tokenizer" and kind == "Metaspace":
        # "first" prepends only to the piece at offset 0 of the original text.
        scheme = node.get("prepend_scheme", "always" if node.get("add_prefix_space") else "never")
        if scheme in ("always", "never"):
            return
        msg = f"Metaspace pre-tokenizer with prepend_scheme {scheme!r} depends on position"
        raise NotSegmentable(msg)
    if kind not in allowed:
        raise NotSegmentable(f"{what} type {kind!r} is not known to be position-free")


def _is_identity(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    return normalizer.get("type") == "Sequence" and all(
        _is_identity(child) for child in normalizer.get("normalizers", [])
    )


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
            _probe(tokenizer, segmenter)
        except NotSegmentable as e:
            return cls(tokenizer, None, cache, fallback_reason=str(e))
        return cls(tokenizer, segmenter, cache)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens, identical to a full encode."""
        return self.encode_many([text])[0]

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
        self.cache.put(prefix + text + suffix, array(_IDS, piece_ids))
        return ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text; the segments nobody has seen go to the tokenizer in
        one batch call, which runs on its Rust threads without the GIL."""
        if self.segmenter is None:
            encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            result = [encoding.ids for encoding in encodings]
            total = sum(map(len, result))
            self.encoded_tokens += total
            self.returned_tokens += total
            return result
        # Two levels: a gap of the first cut (at non-normalized tokens) is looked up
        # whole, and only when it is new is it cut again at the normalized ones
        # (whose pieces are looked up or encoded, and the gap stored with their
        # ids). The gap's ids are its pieces' ids either way (module docstring,
        # point 2); the second cut, a regex scan of the text without a literal
        # prefix, is then paid for the new turns only.
        segmenter = self.segmenter
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

        all_gaps = [segmenter.split_raw(text) for text in texts]
        for gaps in all_gaps:
            for gap in gaps:
                if type(gap) is not str or gap in new_gaps or look_up(gap):
                    continue
                pieces = segmenter.split_normalized(gap)
                new_gaps[gap] = pieces
                for piece in pieces:
                    if type(piece) is str and not look_up(piece):
                        missing.append(piece)
                        found[piece] = array(_IDS)  # filled below
        if missing:
            encodings = self.tokenizer.encode_batch_fast(missing, add_special_tokens=False)
            for piece, encoding in zip(missing, encodings, strict=True):
                ids = found[piece]
                ids.extend(encoding.ids)
                self.encoded_tokens += len(ids)
                cache.put(piece, ids)
        for gap, pieces in new_gaps.items():
            if len(pieces) == 1 and pieces[0] == gap:
                continue  # stored above, as its own piece
            ids = array(_IDS)
            for piece in pieces:
                if type(piece) is int:
                    ids.append(piece)
                else:
                    ids.extend(found[piece])
            found[gap] = ids
            cache.put(gap, ids)
        result = []
        for gaps in all_gaps:
            out = array(_IDS)
            for gap in gaps:
                if type(gap) is int:
                    out.append(gap)
                else:
                    out.extend(found[gap])
            self.returned_tokens += len(out)
            result.append(out.tolist())
        return result


def _probe(tokenizer: Any, segmenter: Segmenter) -> None:
    """Cut and full encodes agree on strings built around every cut token: a guard
    against a library whose rules changed, not the proof. One batch call each way."""
    edges = ("", " ", "  ", "\n", "\t", "a", " a", "\u00e9", "\u0301", "1", "\u65e5", "<", "|")
    probes = []
    for n, token in enumerate(segmenter.cut_tokens):
        for k in range(2):
            before, after = edges[(n + k) % len(edges)], edges[(n + 5 * k + 3) % len(edges)]
            probes.append(f"x{before}{token}{after}y")
        probes.append(f" {token}\u0301{token} ")
        probes.append(f"{token[:-1]}{token}{token}{token[1:]}\n")
    if not probes:
        return
    full = [e.ids for e in tokenizer.encode_batch_fast(probes, add_special_tokens=False)]
    cut = [segmenter.split(text) for text in probes]
    gaps = sorted({piece for pieces in cut for piece in pieces if type(piece) is str})
    encoded = tokenizer.encode_batch_fast(gaps, add_special_tokens=False)
    gap_ids = {gap: encoding.ids for gap, encoding in zip(gaps, encoded, strict=True)}
    for pieces, expected in zip(cut, full, strict=True):
        ids: list[int] = []
        for piece in pieces:
            if type(piece) is int:
                ids.append(piece)
            else:
                ids += gap_ids[piece]
        if ids != expected:
            msg = "segment-wise encoding differs from a full encode on a probe string"
            raise NotSegmentable(msg)
