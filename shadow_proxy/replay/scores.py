"""Teacher-forced scores over a replay (``--score``): per-record values, the
summary's ``score`` entry and its verdict.

Pure (numpy, no socket, no clock). ``ScoreTally.add`` runs once per scored
record (the candidate's scoring, the baseline's, and the baseline's again for
the floor), ``ScoreTally.failed`` once per record a target could not score,
``ScoreTally.summary`` when the report is written.

Per record and per group of positions (``text``, and ``tool_calls``: positions
inside tool-call segments, ``logprobs.tool_call_mask``), the mean over the
group's positions of: the recorded tokens' negative log-likelihood (nats), the
share where the engine's top-1 token is the recorded one, and KL(baseline ||
candidate) (``logprobs.kl``; ``kl_mean.baseline`` is KL(baseline || baseline
scored again), the floor). A record without positions in a group has NaN
there. Differences are candidate - baseline per record, with a paired
bootstrap interval (``significance.bootstrap_mean_diff``).

Greedy records (temperature 0) add their exact match, candidate and baseline,
to McNemar's exact test; sampled ones add their output lengths to a
Mann-Whitney test. At most ``max_samples`` records are kept (a seeded
reservoir past that); the per-position top-1 counts are exact up to
``MAX_POSITION``.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import attrs
import numpy as np

from shadow_proxy.replay.logprobs import Scoring, kl, tool_call_mask
from shadow_proxy.replay.score_verdict import MIN_RECORDS, verdict
from shadow_proxy.replay.significance import bootstrap_mean_diff, mann_whitney, mcnemar_exact

GROUPS = ("text", "tool_calls")
MEASURES = ("nll_mean", "top1_agreement", "kl_mean")
#: Output positions past this are left out of the by-position plot.
MAX_POSITION = 512
_COLUMNS = tuple(
    f"{g}.{m}.{s}" for g in GROUPS for m in MEASURES for s in ("candidate", "baseline")
)


@attrs.define
class _Columns:
    """Per-record float64 columns, a seeded reservoir past ``max_rows``."""

    names: tuple[str, ...]
    max_rows: int
    seen: int = 0
    data: dict[str, array] = attrs.field(factory=dict)
    _rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def add(self, row: dict[str, float]) -> None:
        self.seen += 1
        if not self.data:
            self.data = {n: array("d") for n in self.names}
        nan = float("nan")
        if self.seen <= self.max_rows:
            for n in self.names:
                self.data[n].append(row.get(n, nan))
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.max_rows:
            for n in self.names:
                self.data[n][slot] = row.get(n, nan)

    def column(self, name: str) -> np.ndarray:
        values = self.data.get(name)
        return np.frombuffer(values, dtype=float) if values else np.array([])


def _mean(values: np.ndarray, mask: np.ndarray) -> float:
    return float(values[mask].mean()) if mask.any() else float("nan")


@attrs.define
class ScoreTally:
    """Everything ``--score`` measured, record by record."""

    max_samples: int = 100_000
    top_k: int = 10
    scored: int = 0
    #: Scored records whose output ids the proxy retokenized from text (the
    #: engine streamed none): ids that may not be the ones it generated.
    retokenized: int = 0
    failed_by_target: dict[str, int] = attrs.field(factory=dict)
    positions: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(GROUPS, 0))
    rows: _Columns = attrs.field(init=False)
    #: Per output position: records scored there, and top-1 hits per side.
    at_position: np.ndarray = attrs.field(factory=lambda: np.zeros((3, MAX_POSITION)))
    greedy_exact: list[tuple[bool, bool]] = attrs.field(factory=list)
    sampled_lengths: dict[str, list[int]] = attrs.field(
        factory=lambda: {"candidate": [], "baseline": []}
    )

    def __attrs_post_init__(self) -> None:
        self.rows = _Columns(_COLUMNS, self.max_samples)

    def failed(self, target: str) -> None:
        """A record ``target`` could not score (an error answer, a malformed one)."""
        self.failed_by_target[target] = self.failed_by_target.get(target, 0) + 1

    def add(
        self,
        candidate: Scoring,
        baseline: Scoring,
        baseline_again: Scoring,
        *,
        greedy: bool,
        exact: tuple[bool | None, bool | None] = (None, None),
        lengths: tuple[int | None, int | None] = (None, None),
        retokenized: bool = False,
    ) -> None:
        """One record scored by all three; ``exact`` and ``lengths``: the
        candidate's and the baseline's generated answers against the primary's."""
        self.scored += 1
        self.retokenized += retokenized
        tool = tool_call_mask(baseline.texts)
        kl_c, kl_b = kl(baseline, candidate), kl(baseline, baseline_again)
        values = {
            "nll_mean": (-candidate.logprobs, -baseline.logprobs),
            "top1_agreement": (candidate.top1.astype(float), baseline.top1.astype(float)),
            "kl_mean": (kl_c, kl_b),
        }
        row: dict[str, float] = {}
        for group, mask in (("text", ~tool), ("tool_calls", tool)):
            self.positions[group] += int(mask.sum())
            for measure, (c, b) in values.items():
                row[f"{group}.{measure}.candidate"] = _mean(c, mask)
                row[f"{group}.{measure}.baseline"] = _mean(b, mask)
        self.rows.add(row)
        n = min(len(candidate), MAX_POSITION)
        self.at_position[0, :n] += 1
        self.at_position[1, :n] += candidate.top1[:n]
        self.at_position[2, :n] += baseline.top1[:n]
        if greedy and exact[0] is not None and exact[1] is not None:
            self.greedy_exact.append((exact[0], exact[1]))
        if not greedy:
            for side, length in zip(("candidate", "baseline"), lengths, strict=True):
                if length is not None:
                    self.sampled_lengths[side].append(length)

    def column(self, name: str) -> np.ndarray:
        return self.rows.column(name)

    def group(self, group: str) -> dict[str, Any]:
        """``{measure: {candidate, baseline, diff, ci, n}}`` for one group of positions."""
        out: dict[str, Any] = {"positions": self.positions[group]}
        for measure in MEASURES:
            c = self.column(f"{group}.{measure}.candidate")
            b = self.column(f"{group}.{measure}.baseline")
            keep = ~(np.isnan(c) | np.isnan(b))
            diff, ci = bootstrap_mean_diff(c, b)
            out[measure] = {
                "candidate": _round(float(c[keep].mean())) if keep.any() else None,
                "baseline": _round(float(b[keep].mean())) if keep.any() else None,
                "diff": _round(diff),
                "ci": None if ci is None else [_round(v) for v in ci],
                "n": int(keep.sum()),
            }
        return out

    def summary(self) -> dict[str, Any]:
        """The summary's ``score`` entry (the text group's measures at its top level)."""
        text, tools = self.group("text"), self.group("tool_calls")
        pairs = np.asarray(self.greedy_exact, dtype=bool).reshape(-1, 2)
        test = mcnemar_exact(pairs[:, 0], pairs[:, 1])
        lengths = self.sampled_lengths
        lengths_p = mann_whitney(np.asarray(lengths["candidate"]), np.asarray(lengths["baseline"]))
        out: dict[str, Any] = {
            "records": self.scored,
            "retokenized_records": self.retokenized,
            "sampled": self.rows.seen > self.rows.max_rows,
            "top_k": self.top_k,
            "failed": dict(self.failed_by_target),
            **{m: text[m] for m in MEASURES},
            "text_positions": text["positions"],
            "tool_calls": tools,
            "greedy_records": int(pairs.shape[0]),
            "exact_match": {
                "candidate": int(pairs[:, 0].sum()),
                "baseline": int(pairs[:, 1].sum()),
                "only_candidate": test.only_first,
                "only_baseline": test.only_second,
            },
            "mcnemar_p": _round(test.p_value) if pairs.shape[0] else None,
            "sampled_records": len(lengths["candidate"]),
            "lengths_p": _round(lengths_p),
            "min_records": MIN_RECORDS,
        }
        out["verdict"], out["reason"] = verdict(out)
        return out


def _round(value: float | None) -> float | None:
    return None if value is None or np.isnan(value) else float(f"{value:.6g}")
