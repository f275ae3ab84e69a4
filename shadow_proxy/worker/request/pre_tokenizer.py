"""DeepSeek's pre-tokenizer with its three splits run as one: the same pieces, one scan.

Pure. Applied once per model at load (``tokenizer.load_model``). DeepSeek's
tokenizer.json (V3, R1 and the models that share it) pre-tokenizes with three
regex splits in sequence, each ``Isolated`` (matches and the gaps between them
become pieces), then a byte-level map without a regex of its own:

1. ``\\p{N}{1,3}``: numbers, in runs of up to three;
2. ``[一-龥぀-ゟ゠-ヿ]+``: runs of CJK ideographs and kana (``CJK`` below);
3. words, punctuation and spaces (``_WORDS``).

Each split cuts every piece of the one before, its matches too, and the library
builds each piece with its alignments: a third of an answer's encode is spent
there (issue 34, sixth round). ``MERGED`` cuts where the three cut, in one scan
by the same regex engine (the library's Oniguruma, so the same classes). After
splits 1 and 2 a piece is a number group, a CJK run, or the rest (no N, no CJK);
split 3 then cuts each:

- A number group it leaves whole: an N character is taken only as the optional
  first character before letters or marks, and none follow. ``MERGED``'s first
  alternative takes the same groups: only it takes an N.
- In a CJK run (no spaces, nothing ASCII) only split 3's second and third
  alternatives can match, on CJK characters; a character of none of the
  classes L, M, P, S that no letter or mark follows is left in a gap.
  ``MERGED``'s next three alternatives are those, restricted to CJK, and that
  gap as a match of its own (a piece either way).
- In the rest, ``MERGED``'s last six are split 3's, with N and CJK taken out of
  every class that could take them, and ``(?!\\S)`` (a piece's end counts as no
  non-space) read as ``(?![^\\s\\p{N}CJK])``.
- Every boundary of a piece of split 1 or 2 lies next to an N or a CJK
  character. ``MERGED`` matches each of those with its first four alternatives
  and takes none with the others, which also see past none: no match and no gap
  crosses a boundary, and within a piece the scan is split 3's. No alternative
  of either matches the empty string.

The facts this rests on, in the library's own classes: no CJK character is N
and no space is N or CJK. ``PROBE`` holds every CJK character in one run, every
space beside numbers and CJK, and representatives of each class, and
``faster_pre_tokenizer`` requires the same pieces from both on it before it
swaps them; ``tests/unit/worker/request/test_pre_tokenizer.py`` compares them on
random text and every ordered triple of the representatives. Any other
pre-tokenizer is left as written.
"""

from __future__ import annotations

import json
import random
from typing import Any

#: Split 2's class: CJK ideographs, hiragana and katakana.
CJK = "一-龥\u3040-ゟ゠-ヿ"
#: Split 3 as DeepSeek's tokenizer.json writes it.
_WORDS = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+"
)
#: DeepSeek's three splits, in order.
DEEPSEEK_SPLITS = ("\\p{N}{1,3}", f"[{CJK}]+", _WORDS)
#: The three as one (module docstring).
MERGED = (
    "\\p{N}{1,3}"
    f"|[[{CJK}]&&[^\\p{{L}}\\p{{P}}\\p{{S}}]]?[[{CJK}]&&[\\p{{L}}\\p{{M}}]]+"
    f"|[[{CJK}]&&[\\p{{P}}\\p{{S}}]]+"
    f"|(?:[[{CJK}]&&[^\\p{{L}}\\p{{M}}\\p{{P}}\\p{{S}}]](?![[{CJK}]&&[\\p{{L}}\\p{{M}}]]))+"
    "|[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    f"|[^\r\n\\p{{L}}\\p{{P}}\\p{{S}}\\p{{N}}{CJK}]?[\\p{{L}}\\p{{M}}&&[^{CJK}]]+"
    f"| ?[\\p{{P}}\\p{{S}}&&[^{CJK}]]+[\r\n]*"
    "|\\s*[\r\n]+"
    f"|\\s+(?![^\\s\\p{{N}}{CJK}])"
    "|\\s+"
)

#: A character of each kind the patterns tell apart, and those at the edges of
#: CJK: numbers (decimal, letter-like, other), CJK (ranges' ends, a mark, a
#: symbol and a punctuation mark inside them), letters and marks, punctuation and
#: symbols (ASCII and not), spaces, and characters of no class (controls,
#: formats, private use, unassigned).
REPRESENTATIVES = (
    "0", "7", "\u0663", "\u00bd", "\u216b", "\U0001d7d8", "\u3007",
    "一", "龥", "中", "\u3040", "\u3097", "ゟ", "゠", "ヿ", "ア", "の", "\u3099", "゛", "・", "ー",
    "a", "Z", "é", "ß", "Ж", "α", "ﬁ", "\U0001d49c", "가", "\u9fa6", "\u3400",
    "\u0301", "\u0903", "\u20dd",
    "!", "'", "-", ".", "[", "\\", "_", "、", "«", "—", "〜", "\uff01",
    "$", "+", "^", "`", "|", "~", "€", "©", "\U0001f600",
    " ", "\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u2028", "\u3000", "\u200a",
    "\x00", "\x1b", "\u200b", "\ue000", "\U000e0001", "\u0378", "\ufffd",
)  # fmt: skip
#: Unicode's White_Space characters.
_SPACES = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_SPACES += "\u2028\u2029\u202f\u205f\u3000"


def _probe() -> list[str]:
    """Every CJK character in one run; every space between numbers and CJK; 400
    random strings of the representatives (a fixed seed)."""
    cjk = "".join(
        map(chr, [*range(0x4E00, 0x9FA6), *range(0x3040, 0x30A0), *range(0x30A0, 0x3100)])
    )
    spaces = [f"1{s}2{s}{s}一{s}a{s}" for s in _SPACES]
    rng = random.Random(34)
    texts = ["".join(rng.choices(REPRESENTATIVES, k=rng.randint(1, 40))) for _ in range(400)]
    return [cjk, "1" + cjk + "12345", *spaces, *texts]


PROBE = _probe()
#: What ``faster_pre_tokenizer`` returns when it swapped the splits.
APPLIED = "DeepSeek's three splits run as one"


def deepseek_splits(tokenizer: Any) -> dict[str, Any] | None:
    """The trailing ``ByteLevel`` of ``tokenizer``'s pre-tokenizer when the rest is
    DeepSeek's three splits exactly; None otherwise."""
    part = tokenizer.pre_tokenizer
    if part is None:
        return None
    config = json.loads(part.__getstate__())
    if config.get("type") != "Sequence":
        return None
    *splits, last = config.get("pretokenizers", [None])
    if (
        not isinstance(last, dict)
        or last.get("type") != "ByteLevel"
        or last.get("use_regex", True)
        or len(splits) != len(DEEPSEEK_SPLITS)
    ):
        return None
    for split, pattern in zip(splits, DEEPSEEK_SPLITS, strict=True):
        if split != {
            "type": "Split",
            "pattern": {"Regex": pattern},
            "behavior": "Isolated",
            "invert": False,
        }:
            return None
    return last


def faster_pre_tokenizer(tokenizer: Any) -> str | None:
    """Put ``MERGED`` in place of DeepSeek's three splits in ``tokenizer`` when it
    has them and the two cut ``PROBE`` alike; returns what was done (None:
    nothing, the pre-tokenizer is not DeepSeek's)."""
    byte_level = deepseek_splits(tokenizer)
    if byte_level is None:
        return None
    from tokenizers import Regex, pre_tokenizers  # as load_model: only once loading

    merged = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(MERGED), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(
                add_prefix_space=byte_level.get("add_prefix_space", True),
                trim_offsets=byte_level.get("trim_offsets", True),
                use_regex=False,
            ),
        ]
    )
    written = tokenizer.pre_tokenizer
    for text in PROBE:
        if merged.pre_tokenize_str(text) != written.pre_tokenize_str(text):
            return f"DeepSeek's three splits kept: one cut differs on {text[:40]!r}"
    tokenizer.pre_tokenizer = merged
    return APPLIED
