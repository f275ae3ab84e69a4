"""Where a prompt may be cut so that its pieces encode alone to the prompt's ids.

Pure. ``Segmenter.for_tokenizer`` checks a ``tokenizers.Tokenizer`` (raising
``NotSegmentable`` with the reason when cutting cannot be proven exact) and ``probe``
compares cut and full encodes on strings built around every cut token; the
incremental encoder (``incremental.py``) then reuses the ids of pieces it has seen.

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
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import attrs

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
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "Lowercase",
        "Strip",
        "StripAccents",
        "Replace",
        "Prepend",
        "BertNormalizer",
        "Precompiled",
        "Nmt",
        "ByteLevel",
    }
)
#: Post-processors that add nothing when ``add_special_tokens`` is false.
_QUIET_POST_PROCESSORS = frozenset(
    {"ByteLevel", "TemplateProcessing", "BertProcessing", "RobertaProcessing"}
)
_DETERMINISTIC_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})


class NotSegmentable(ValueError):
    """Cutting at added tokens is not provably exact for this tokenizer; says why."""


def literal_regex(strings: list[str]) -> re.Pattern[str] | None:
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
        raw_tokens: list[Any] = []
        normalized_tokens: list[Any] = []
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
            raw=literal_regex(list(raw_ids)),
            raw_ids=raw_ids,
            normalized=literal_regex(list(normalized_ids)),
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

    def split_raw_from(self, text: str, start: int) -> tuple[list[str | int], list[int]]:
        """``split_raw`` of ``text[start:]`` (``start`` a point where the scan of
        ``text`` restarts: 0, or the end of a match), and where each match ends."""
        ends: list[int] = []
        return _cut(text, self.raw, self.raw_ids, start, ends), ends

    @functools.cached_property
    def longest_raw(self) -> int:
        """The longest non-normalized added token, in characters: no match of the
        scan reaches further than this from where it starts."""
        return max(map(len, self.raw_ids), default=0)

    def split_normalized(self, gap: str) -> list[str | int]:
        """A gap of ``split_raw`` cut again at the normalized added tokens (itself
        when those are not cut): the pieces whose ids make up the gap's."""
        if self.normalized is None:
            return [gap]
        return _cut(gap, self.normalized, self.normalized_ids)


def _cut(
    text: str,
    pattern: re.Pattern[str] | None,
    ids: dict[str, int],
    start: int = 0,
    ends: list[int] | None = None,
) -> list[str | int]:
    """``text[start:]`` cut at the matches of ``pattern``: gaps as str, matches as
    their ids; where each match ends is appended to ``ends`` if given."""
    if pattern is None:
        return [text[start:]] if start < len(text) else []
    pieces: list[str | int] = []
    for match in pattern.finditer(text, start):
        if match.start() > start:
            pieces.append(text[start : match.start()])
        pieces.append(ids[match.group()])
        start = match.end()
        if ends is not None:
            ends.append(start)
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


def probe(tokenizer: Any, segmenter: Segmenter) -> None:
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
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids += gap_ids[piece]
        if ids != expected:
            msg = "segment-wise encoding differs from a full encode on a probe string"
            raise NotSegmentable(msg)
