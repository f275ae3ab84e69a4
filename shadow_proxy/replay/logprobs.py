"""Teacher-forced log-probabilities of a recorded output (``--score``).

Pure: no socket, no clock. ``score_body`` builds the one request that scores a
record: ``POST /v1/completions`` with prompt = the record's prompt ids + the
primary's output ids (choice 0), ``max_tokens: 1`` and ``prompt_logprobs: K``.
``Scoring.from_response`` reads the answer (vLLM's ``choices[0].prompt_logprobs``:
one entry per prompt position, the first null, each a map ``token id ->
{logprob, rank, decoded_token}`` holding the top K and the position's own token
at its rank); ``kl`` compares two scorings of the same output.

What engines do with it: vLLM 0.32 returns ``prompt_logprobs``; Dynamo 1.6.1
answers 200 and ignores the field (no ``prompt_logprobs`` in its answer), so
``--score`` refuses it up front (``scorer.Scorer.probe``).

KL(P || Q) from top-K lists is a lower bound: at each position the tokens both
lists report (the recorded token is always in both) are kept as they are and
every other token is merged into one "rest" bucket (1 - the kept tokens'
probability, on each side). Merging outcomes never increases a KL divergence
(the data-processing inequality), so the estimate is at most the true value,
and exact when both lists cover the distribution.

Tool-call positions: tokens whose text lies within a ``<tool_call>`` ...
``</tool_call>`` segment of the recorded output (the Hermes format vLLM's
``hermes`` parser reads: function name and argument JSON, markers included),
found on the texts the engine decodes for each token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

DEFAULT_TOP_K = 10
TOOL_CALL_SEGMENT = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)
#: A side's "rest" probability is at least this (a log of 0 otherwise).
_FLOOR = 1e-12


class ScoringError(ValueError):
    """An answer that is not a scoring of the output sent."""


def score_body(
    model: str, prompt_ids: Sequence[int], output_ids: Sequence[int], top_k: int
) -> dict[str, Any]:
    """The body that scores ``output_ids`` after ``prompt_ids``."""
    return {
        "model": model,
        "prompt": [*prompt_ids, *output_ids],
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": top_k,
        "stream": False,
    }


@attrs.frozen
class Scoring:
    """One engine's log-probabilities at each position of a recorded output."""

    #: The recorded tokens' log-probabilities.
    logprobs: np.ndarray
    #: The engine's most likely token is the recorded one.
    top1: np.ndarray
    #: Per position, the reported tokens' log-probabilities (top K and the recorded one).
    tops: tuple[dict[int, float], ...]
    #: Per position, the recorded token's text as the engine decodes it.
    texts: tuple[str, ...]

    @classmethod
    def from_response(cls, body: Mapping[str, Any], output_ids: Sequence[int]) -> Scoring:
        """The scoring in a completions answer whose prompt ended with ``output_ids``."""
        try:
            entries = body["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            entries = None
        if not isinstance(entries, list):
            msg = "the answer has no choices[0].prompt_logprobs"
            raise ScoringError(msg)
        n = len(output_ids)
        if len(entries) < n + 1:
            msg = f"prompt_logprobs has {len(entries)} entries for {n} output tokens and a prompt"
            raise ScoringError(msg)
        logprobs, top1, tops, texts = [], [], [], []
        for token, entry in zip(output_ids, entries[len(entries) - n :], strict=True):
            if not isinstance(entry, Mapping) or str(token) not in entry:
                msg = f"prompt_logprobs does not report the recorded token {token}"
                raise ScoringError(msg)
            try:
                own = entry[str(token)]
                logprobs.append(float(own["logprob"]))
                top1.append(own.get("rank") == 1)
                tops.append({int(k): float(v["logprob"]) for k, v in entry.items()})
                texts.append(str(own.get("decoded_token") or ""))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                msg = f"a malformed prompt_logprobs entry ({type(exc).__name__}: {exc})"
                raise ScoringError(msg) from None
        return cls(
            np.asarray(logprobs, dtype=float),
            np.asarray(top1, dtype=bool),
            tuple(tops),
            tuple(texts),
        )

    def __len__(self) -> int:
        return int(self.logprobs.size)


def kl_lower_bound(p: Mapping[int, float], q: Mapping[int, float]) -> float:
    """KL(P || Q) over the tokens both report plus the rest bucket (module docstring)."""
    shared = p.keys() & q.keys()
    total, p_kept, q_kept = 0.0, 0.0, 0.0
    for token in shared:
        lp, lq = p[token], q[token]
        pp = math.exp(lp)
        total += pp * (lp - lq)
        p_kept += pp
        q_kept += math.exp(lq)
    p_rest, q_rest = max(1.0 - p_kept, 0.0), max(1.0 - q_kept, _FLOOR)
    if p_rest > 0:
        total += p_rest * math.log(p_rest / q_rest)
    return max(total, 0.0)


def kl(p: Scoring, q: Scoring) -> np.ndarray:
    """Per position, the lower bound of KL(P || Q) (same output scored twice)."""
    if len(p) != len(q):
        msg = f"scorings of different outputs ({len(p)} and {len(q)} positions)"
        raise ScoringError(msg)
    return np.asarray([kl_lower_bound(a, b) for a, b in zip(p.tops, q.tops, strict=True)])


def tool_call_mask(texts: Sequence[str]) -> np.ndarray:
    """Positions whose token text overlaps a tool-call segment of the joined text."""
    joined = "".join(texts)
    mask = np.zeros(len(texts), dtype=bool)
    spans = [m.span() for m in TOOL_CALL_SEGMENT.finditer(joined)]
    if not spans:
        return mask
    start = 0
    for i, text in enumerate(texts):
        end = start + len(text)
        mask[i] = any(a < max(end, start + 1) and start < b for a, b in spans)
        start = end
    return mask
