"""The score verdict (``--score``): worse, no difference or better than the baseline.

Pure. ``verdict`` runs once per summary on the ``score`` entry that
``scores.ScoreTally.summary`` built, and returns the verdict with, in one
sentence, the numbers that decided it:

- ``no verdict`` below ``MIN_RECORDS`` scored records;
- ``worse`` when any of: the candidate's top-1 agreement is lower by more than
  ``MIN_TOP1_DIFF`` (0.5 points) with the whole 95% interval of the per-record
  difference below zero; its NLL higher by more than ``MIN_NLL_DIFF`` nats with
  the whole interval above zero; its KL from the baseline above the floor
  (KL of the baseline scored twice) by more than ``MIN_KL_DIFF`` with the whole
  interval above zero; McNemar's exact test on greedy records' exact matches
  (p < ``ALPHA``) with fewer candidate matches; output lengths of sampled
  records differing (Mann-Whitney p < ``ALPHA``). Text and tool-call positions
  are judged alike, each apart (a group needs ``MIN_RECORDS`` records with
  positions in it);
- ``better`` when top-1 agreement is higher and NLL lower (both whole
  intervals, beyond the same margins) and nothing says worse;
- ``no difference`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WORSE = "worse"
NO_DIFFERENCE = "no difference"
BETTER = "better"
NO_VERDICT = "no verdict"
SCORE_VERDICTS = (WORSE, NO_DIFFERENCE, BETTER, NO_VERDICT)
MIN_RECORDS = 10
ALPHA = 0.05
MIN_TOP1_DIFF = 0.005
MIN_NLL_DIFF = 0.01
#: The KL bound is small where top-K lists hold little mass (a near-uniform
#: model): any excess over the floor with its whole interval above zero counts.
MIN_KL_DIFF = 0.0


def _beyond(entry: Mapping[str, Any], margin: float, sign: int) -> bool:
    """The difference is past ``margin`` in the direction ``sign`` and its whole
    interval is on that side of zero."""
    diff, ci = entry.get("diff"), entry.get("ci")
    if diff is None or not ci or entry.get("n", 0) < MIN_RECORDS:
        return False
    return sign * diff > margin and (ci[0] > 0 if sign > 0 else ci[1] < 0)


def _kl_above_floor(entry: Mapping[str, Any]) -> bool:
    return _beyond(entry, MIN_KL_DIFF, +1)


def _said(name: str, entry: Mapping[str, Any]) -> str:
    ci = entry["ci"]
    return (
        f"{name} candidate {entry['candidate']:.4g} vs baseline {entry['baseline']:.4g} "
        f"(diff {entry['diff']:+.4g}, 95% CI [{ci[0]:.4g}, {ci[1]:.4g}], n={entry['n']})"
    )


def verdict(score: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) for a summary's ``score`` entry."""
    records = score["records"]
    if records < MIN_RECORDS:
        return NO_VERDICT, f"only {records} records scored; a verdict needs {MIN_RECORDS}"
    worse: list[str] = []
    better: list[str] = []
    for label, group in (("text", score), ("tool calls", score["tool_calls"])):
        top1, nll, kl = group["top1_agreement"], group["nll_mean"], group["kl_mean"]
        if _beyond(top1, MIN_TOP1_DIFF, -1):
            worse.append(_said(f"{label} top-1 agreement", top1))
        if _beyond(nll, MIN_NLL_DIFF, +1):
            worse.append(_said(f"{label} NLL", nll))
        if _kl_above_floor(kl):
            worse.append(_said(f"{label} KL(baseline||candidate) over the floor", kl))
        if _beyond(top1, MIN_TOP1_DIFF, +1) and _beyond(nll, MIN_NLL_DIFF, -1):
            better += [_said(f"{label} top-1 agreement", top1), _said(f"{label} NLL", nll)]
    exact = score["exact_match"]
    p = score.get("mcnemar_p")
    if p is not None and p < ALPHA and exact["only_baseline"] > exact["only_candidate"]:
        worse.append(
            f"greedy exact match {exact['candidate']} vs {exact['baseline']} of "
            f"{score['greedy_records']} (McNemar p={p:.2g})"
        )
    lengths_p = score.get("lengths_p")
    if lengths_p is not None and lengths_p < ALPHA:
        worse.append(
            f"sampled output lengths differ (Mann-Whitney p={lengths_p:.2g}, "
            f"{score['sampled_records']} records)"
        )
    if worse:
        return WORSE, "; ".join(worse)
    if better:
        return BETTER, "; ".join(better)
    top1 = score["top1_agreement"]
    shown = _said("top-1 agreement", top1) if top1.get("ci") else "no interval"
    return NO_DIFFERENCE, f"nothing outside the baseline's noise: {shown}; McNemar p={p}"
