"""The replay's output: DIR/pairs.jsonl, summary.json, report.md and PNG plots.

``PairsWriter.write`` runs once per replayed request, as it finishes (a line
is flushed each time, so a killed run leaves every finished pair on disk).
``write_report`` runs once at the end, also after Ctrl-C with what was done:
it writes summary.json (atomically), report.md and the plots. Plots use
matplotlib's Agg backend (no display); each names the command that produced
it in its footer.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from shadow_proxy.replay.stats import METRICS, Tally

PAIRS = "pairs.jsonl"
SUMMARY = "summary.json"
REPORT = "report.md"
LATENCY_PNG = "latency.png"
DIVERGENCE_PNG = "divergence.png"
_LABELS = {"ttft_ms": "TTFT (ms)", "itl_ms": "mean inter-token latency (ms)", "e2e_ms": "e2e (ms)"}
_COLORS = {"primary": "#4c72b0", "candidate": "#dd8452", "baseline": "#55a868"}


class PairsWriter:
    """Appends one JSON line per replayed request to DIR/pairs.jsonl."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / PAIRS
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")

    def write(self, line: Mapping[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_report(
    out_dir: Path, tally: Tally, run: Mapping[str, Any], command: str
) -> dict[str, Any]:
    """summary.json, report.md and the plots; returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**tally.summary(), "run": dict(run)}
    partial = out_dir / f".{SUMMARY}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, out_dir / SUMMARY)
    plots = plot(out_dir, tally, command)
    (out_dir / REPORT).write_text(markdown(summary, command, plots), encoding="utf-8")
    return summary


# --------------------------------------------------------------------------- markdown


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return lines


def _ci(value: Any) -> str:
    return "-" if not value else f"[{value[0]:.4g}, {value[1]:.4g}]"


def markdown(summary: Mapping[str, Any], command: str, plots: Sequence[str]) -> str:
    """report.md: the run, the counts, latencies with their verdicts, differences."""
    run = summary["run"]
    baseline = bool(run.get("baseline"))
    lines = [
        "# shadow-replay report",
        "",
        f"Command: `{command}`",
        "",
        f"Candidate: {run.get('candidate')}"
        + (f"; baseline: {run['baseline']}" if baseline else ""),
        f"Finished: {run.get('finished')}"
        + ("" if run.get("complete", True) else " (interrupted: what was done)"),
        "",
        "## Requests",
        "",
    ]
    skipped = ", ".join(f"{k} {v}" for k, v in summary["skipped"].items()) or "none"
    unreadable = run.get("unreadable") or {}
    rows = [
        ["records read", summary["records"]],
        ["replayed", summary["replayed"]],
        ["skipped", skipped],
        ["unreadable", ", ".join(f"{k} {v}" for k, v in unreadable.items()) or "none"],
        ["candidate errors", summary["errors"]],
        ["outputs compared", summary["compared"]],
        ["exact match rate", summary["exact_match_rate"]],
        ["prompt token mismatches", summary["prompt_token_mismatches"]],
        ["first divergent position (p50/p90/p99)", _pcts(summary.get("first_divergence"))],
    ]
    if baseline:
        rows.insert(5, ["baseline errors", summary.get("baseline_errors")])
    lines += _table(["", "value"], rows)
    uncompared = summary.get("output_basis", {}).get("none")
    if uncompared:
        lines += [
            "",
            f"{uncompared} outputs were not compared: no common basis (the record holds "
            "token ids and the candidate returned text only, or the reverse); "
            "`--tokenizer DIR` encodes the candidate's text as the proxy encodes the primary's.",
        ]
    lines += ["", "## Latency", ""]
    judged = "candidate / baseline" if baseline else "candidate / primary"
    head = ["metric", "primary p50/p90/p99", "candidate p50/p90/p99"]
    if baseline:
        head += ["baseline p50/p90/p99", "baseline/primary p50"]
    head += ["candidate/primary p50", f"{judged} 95% CI", "verdict"]
    rows = []
    for metric in METRICS:
        entry = summary[metric]
        row = [metric, _pcts(entry["primary"]), _pcts(entry["candidate"])]
        if baseline:
            base_ci = _ci(entry.get("baseline_ratio_p50_ci95"))
            row += [
                _pcts(entry.get("baseline")),
                f"{_fmt(entry.get('baseline_ratio_p50'))} {base_ci}",
            ]
        ci = entry.get("candidate_vs_baseline_ci95") if baseline else entry["ratio_p50_ci95"]
        row += [_fmt(entry["ratio_p50"]), _ci(ci), entry["verdict"]]
        rows.append(row)
    lines += _table(head, rows)
    tolerance = summary["tolerance"]
    lines += [
        "",
        f"A latency difference counts when the whole 95% interval of {judged} (paired "
        f"bootstrap of the p50 ratio) lies outside [1/{1 + tolerance:g}, {1 + tolerance:g}] "
        f"and the p50s differ by at least {summary['min_diff_ms']:g} ms.",
        "",
        "## Differences per request",
        "",
    ]
    note = (
        "counted = the candidate differs and the baseline does not (noise = both differ)"
        if baseline
        else "no baseline: every difference counts"
    )
    lines += _table(
        ["field", "differs", "noise", "counted"],
        [[k, v["differs"], v["noise"], v["counted"]] for k, v in summary["differences"].items()],
    )
    lines += ["", note, ""]
    if summary.get("sampled"):
        lines += ["Percentiles and plots use a uniform sample of the pairs.", ""]
    lines += [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def _pcts(p: Mapping[str, float] | None) -> str:
    return "-" if not p else f"{p['p50']:.4g} / {p['p90']:.4g} / {p['p99']:.4g}"


# --------------------------------------------------------------------------- plots


def command_footer(fig: Any, command: str) -> None:
    """The command that produced the figure, at its foot (leave the bottom 6% free)."""
    text = "\n".join(textwrap.wrap(f"produced by: {command}", 150)[:3])
    fig.text(0.01, 0.01, text, fontsize=7, family="monospace", va="bottom")


def plot(out_dir: Path, tally: Tally, command: str) -> list[str]:
    """latency.png (ECDFs of TTFT, ITL and e2e per side) and divergence.png
    (histogram of first divergent positions); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    samples = tally.samples
    sides = ("primary", "candidate", "baseline") if tally.has_baseline else ("primary", "candidate")
    fig, axes = plt.subplots(1, len(METRICS), figsize=(15, 4.8))
    for ax, metric in zip(axes, METRICS, strict=True):
        drawn = False
        for side in sides:
            values = samples.column(f"{metric}.{side}")
            values = np.sort(values[~np.isnan(values)])
            if values.size:
                ax.step(
                    values,
                    np.arange(1, values.size + 1) / values.size,
                    where="post",
                    label=f"{side} (n={values.size})",
                    color=_COLORS[side],
                )
                drawn = True
        ax.set_xlabel(_LABELS[metric])
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if drawn:  # a legend without lines is a warning (a run with nothing replayed)
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Latency distributions (ECDF)")
    command_footer(fig, command)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(out_dir / LATENCY_PNG, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn = False
    highest = 0.0
    for side in sides[1:]:
        values = samples.column(f"divergence.{side}")
        values = values[~np.isnan(values)]
        if values.size:
            bins = np.arange(0, values.max() + 2) - 0.5 if values.max() < 200 else 50
            ax.hist(
                values, bins=bins, alpha=0.6, label=f"{side} (n={values.size})", color=_COLORS[side]
            )
            drawn = True
            highest = max(highest, float(values.max()))
    if drawn and highest < 200:  # positions are whole tokens: whole ticks
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.5, max(highest, 1) + 0.5)
    if not drawn:
        ax.text(0.5, 0.5, "no divergent outputs", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("first divergent position (token, or character without token ids)")
    ax.set_ylabel("requests")
    ax.set_title("Where outputs first differ from the primary's")
    command_footer(fig, command)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out_dir / DIVERGENCE_PNG, dpi=100)
    plt.close(fig)
    return [LATENCY_PNG, DIVERGENCE_PNG]
