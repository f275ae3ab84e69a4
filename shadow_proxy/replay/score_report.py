"""The ``--score`` part of the report: report.md's "Scores" section and score.png.

``section`` and ``plot`` run once, from ``report.write_report``, when the run
scored (``--score``). score.png has two panels: top-1 agreement by output
position (candidate and baseline, positions where at least
``MIN_AT_POSITION`` records reach), and per-record NLL, candidate against
baseline (a point per record; on the diagonal: no difference). It names the
command that produced it in its footer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shadow_proxy.replay.scores import ScoreTally

SCORE_PNG = "score.png"
Footer = Callable[[Any, str], None]
MIN_AT_POSITION = 5
_ROWS = (
    ("top-1 agreement", "top1_agreement"),
    ("NLL (nats/token)", "nll_mean"),
    ("KL(baseline||candidate)", "kl_mean"),
)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _row(label: str, entry: Mapping[str, Any], floor_name: str | None = None) -> str:
    ci = entry.get("ci")
    interval = "-" if not ci else f"[{ci[0]:.4g}, {ci[1]:.4g}]"
    baseline = _fmt(entry.get("baseline")) + (f" ({floor_name})" if floor_name else "")
    cells = [label, _fmt(entry.get("candidate")), baseline, _fmt(entry.get("diff")), interval]
    return "| " + " | ".join([*cells, str(entry.get("n", 0))]) + " |"


def section(score: Mapping[str, Any]) -> list[str]:
    """The "Scores" section: the table (text and tool-call positions), the
    paired tests and the verdict with its reason."""
    lines = [
        "## Scores (teacher-forced, --score)",
        "",
        f"The primary's recorded output of each record, scored by the candidate once and the "
        f"baseline twice (top {score['top_k']} log-probabilities per position). "
        f"{score['records']} records scored ({score['text_positions']} text positions, "
        f"{score['tool_calls']['positions']} tool-call positions; "
        f"{score['retokenized_records']} with output ids the proxy retokenized from text, which "
        "may not be the ids the engine generated); not scored: "
        + (", ".join(f"{k} {v}" for k, v in score["failed"].items()) or "none")
        + ".",
        "",
        "| positions: measure | candidate | baseline | diff (candidate - baseline) | 95% CI | n |",
        "|---|---|---|---|---|---|",
    ]
    for group, entry in (("text", score), ("tool calls", score["tool_calls"])):
        for label, key in _ROWS:
            floor = "floor: baseline scored twice" if key == "kl_mean" else None
            lines.append(_row(f"{group}: {label}", entry[key], floor))
    exact = score["exact_match"]
    lines += [
        "",
        f"Greedy records: {score['greedy_records']}, exact match candidate {exact['candidate']}, "
        f"baseline {exact['baseline']} (only candidate {exact['only_candidate']}, only baseline "
        f"{exact['only_baseline']}); McNemar exact p = {_fmt(score['mcnemar_p'])}. "
        f"Sampled records: {score['sampled_records']}; output lengths, Mann-Whitney "
        f"p = {_fmt(score['lengths_p'])}.",
        "",
        f"**Score verdict: {score['verdict']}**: {score['reason']}.",
        "",
        "KL is a lower bound from the top-K lists (tokens both report, the rest in one "
        "bucket); its baseline column is the floor, KL between two scorings of the baseline. "
        f"No verdict below {score['min_records']} records.",
        "",
    ]
    return lines


def plot(out_dir: Path, tally: ScoreTally, command: str, verdict: str, footer: Footer) -> list[str]:
    """score.png, ``footer`` naming the command (``report.command_footer``);
    returns the files written (none without a scored record)."""
    path = out_dir / SCORE_PNG
    if tally.scored == 0:
        path.unlink(missing_ok=True)
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    counts, cand, base = tally.at_position
    shown = np.flatnonzero(counts >= MIN_AT_POSITION)
    if shown.size:
        for hits, label, color in ((cand, "candidate", "#dd8452"), (base, "baseline", "#55a868")):
            left.plot(shown, hits[shown] / counts[shown], label=label, color=color)
        left.legend(fontsize=8)
    left.set_xlabel("output position (token)")
    left.set_ylabel("top-1 agreement with the recorded token")
    left.set_title(f"Top-1 agreement by position (positions with >= {MIN_AT_POSITION} records)")
    left.grid(alpha=0.3)
    c, b = tally.column("text.nll_mean.candidate"), tally.column("text.nll_mean.baseline")
    keep = ~(np.isnan(c) | np.isnan(b))
    right.scatter(
        b[keep], c[keep], s=8, alpha=0.6, color="#4c72b0", label=f"records (n={keep.sum()})"
    )
    if keep.any():
        lo, hi = float(min(b[keep].min(), c[keep].min())), float(max(b[keep].max(), c[keep].max()))
        right.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="no difference")
        right.legend(fontsize=8)
    right.set_xlabel("baseline NLL (nats/token, text positions)")
    right.set_ylabel("candidate NLL")
    right.set_title("Per-record NLL of the recorded output")
    right.grid(alpha=0.3)
    fig.suptitle(f"Teacher-forced scores: verdict {verdict}")
    footer(fig, command)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [SCORE_PNG]
