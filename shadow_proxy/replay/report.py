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

from shadow_proxy.replay import score_report
from shadow_proxy.replay.scores import ScoreTally
from shadow_proxy.replay.stats import METRICS, Tally
from shadow_proxy.replay.turns_report import closed_loop_section

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
    out_dir: Path,
    tally: Tally,
    run: Mapping[str, Any],
    command: str,
    scores: ScoreTally | None = None,
    closed_loop: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json, report.md and the plots; returns the summary (with
    ``scores``: its section, score.png and the summary's ``score``; with
    ``closed_loop``, ``--closed-loop``'s own figures)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**tally.summary(), "run": dict(run)}
    if scores is not None:
        summary["score"] = scores.summary()
    if closed_loop is not None:
        summary["closed_loop"] = dict(closed_loop)
    partial = out_dir / f".{SUMMARY}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, out_dir / SUMMARY)
    plots = plot(out_dir, tally, command)
    text = markdown(summary, command, plots)
    if scores is not None:
        plots = score_report.plot(
            out_dir, scores, command, summary["score"]["verdict"], command_footer
        )
        text += (
            "\n".join(
                ["", *score_report.section(summary["score"]), *(f"![{p}]({p})" for p in plots)]
            )
            + "\n"
        )
    (out_dir / REPORT).write_text(text, encoding="utf-8")
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
    """report.md: the run, the counts, the errors, latencies with the ratio
    each verdict judged, differences."""
    run = summary["run"]
    baseline = bool(run.get("baseline")) and "baseline_errors" in summary
    lines = [
        "# shadow-replay report",
        "",
        f"Command: `{command}`",
        "",
        f"Candidate: {run.get('candidate')}"
        + (f"; baseline: {run['baseline']}" if baseline else ""),
        f"Finished: {run.get('finished')}" + _how_it_ended(run),
        "",
    ]
    if run.get("error"):
        lines += [f"The run failed: {run['error']}", ""]
    lines += ["## Requests", ""]
    skipped = ", ".join(f"{k} {v}" for k, v in summary["skipped"].items()) or "none"
    unreadable = run.get("unreadable") or {}
    not_compared = summary.get("not_compared") or {}
    rows = [
        ["records read", summary["records"]],
        ["replayed", summary["replayed"]],
        ["skipped", skipped],
        ["unreadable", ", ".join(f"{k} {v}" for k, v in unreadable.items()) or "none"],
        ["candidate errors", _errors(summary["errors"], summary.get("errors_by_status"))],
    ]
    if baseline:
        rows.append(
            [
                "baseline errors",
                _errors(
                    summary.get("baseline_errors", 0), summary.get("baseline_errors_by_status")
                ),
            ]
        )
    rows += [
        ["primary failed (in the record)", summary.get("primary_failed", 0)],
        ["outputs compared", summary["compared"]],
        [
            "not compared: a side failed / no common basis",
            f"{not_compared.get('failed', 0)} / {not_compared.get('no_common_basis', 0)}",
        ],
        ["exact match rate", summary["exact_match_rate"]],
        ["prompt token mismatches", summary["prompt_token_mismatches"]],
        ["first divergent position (p50/p90/p99)", _pcts(summary.get("first_divergence"))],
    ]
    lines += _table(["", "value"], rows)
    uncompared = not_compared.get("no_common_basis")
    if uncompared:
        lines += [
            "",
            f"{uncompared} outputs were not compared: no common basis (the record holds "
            "token ids and the candidate returned text only, or the reverse); "
            "`--tokenizer DIR` encodes the candidate's text as the proxy encodes the primary's.",
        ]
    lines += _error_section(summary, baseline)
    lines += _latency_section(summary, baseline)
    if "closed_loop" in summary:
        lines += closed_loop_section(summary["closed_loop"], run.get("warmup"))
    lines += ["", "## Differences per request", ""]
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


def _how_it_ended(run: Mapping[str, Any]) -> str:
    stopped = run.get("stopped_by", "end")
    if stopped == "max_records":
        return f" (stopped after --max-records {run.get('max_records')})"
    if stopped == "duration":
        return f" (stopped after --duration {run.get('duration_s'):g} s)"
    if not run.get("complete", True):
        return " (interrupted: what was done)"
    return ""


def _errors(total: int, by_status: Mapping[str, int] | None) -> str:
    if not total:
        return "0"
    detail = ", ".join(f"{k} x{v}" for k, v in (by_status or {}).items())
    return f"{total} ({detail})" if detail else str(total)


def _error_section(summary: Mapping[str, Any], baseline: bool) -> list[str]:
    """Per target: failed requests by status, and the first distinct messages."""
    targets = [("candidate", summary.get("errors_by_status"), summary.get("error_examples"))]
    if baseline:
        targets.append(
            (
                "baseline",
                summary.get("baseline_errors_by_status"),
                summary.get("baseline_error_examples"),
            )
        )
    rows = [[t, k, v] for t, by, _ in targets for k, v in (by or {}).items()]
    if not rows:
        return []
    lines = ["", "## Errors", ""]
    lines += _table(["target", "status", "requests"], rows)
    lines += ["", "First messages:", ""]
    for target, _, examples in targets:
        for example in examples or ():
            message = example["message"].replace("`", "'") or "(no message)"
            lines.append(f"- {target}, {example['status']}: `{message}`")
    lines.append("")
    lines.append(
        "Statuses: an HTTP status; `connection` (no answer began); `timeout` (no "
        "connection, or nothing read, within --connect-timeout-s / --read-timeout-s); "
        "`stream` (the answer began, then failed: an error event, a broken stream)."
    )
    return lines


def _latency_section(summary: Mapping[str, Any], baseline: bool) -> list[str]:
    reference = "baseline" if baseline else "primary"
    timed = summary.get("primary_timed_from") or {}
    sent, arrival = timed.get("upstream_send", 0), timed.get("arrival", 0)
    older = (
        f" and, in {arrival} records written before that was recorded, from the request's "
        "arrival at the proxy"
        if arrival
        else ""
    )
    others = "the candidate's and the baseline's" if baseline else "the candidate's"
    measured = (
        "The primary's latencies were measured at the proxy, from its send to the frontend "
        f"({sent} records){older}; {others} by the replayer, from its send. Successful "
        "requests only: n is the number of requests with the value."
    )
    lines = ["", "## Latency", "", measured, ""]
    head = ["metric", "primary p50/p90/p99 (n)", "candidate p50/p90/p99 (n)"]
    if baseline:
        head += ["baseline p50/p90/p99 (n)", "baseline/primary p50 [95% CI]"]
    head += [f"candidate/{reference} p50", "95% CI", "pairs", "verdict"]
    rows = []
    for metric in METRICS:
        entry = summary[metric]
        judged = entry.get("judged") or {}
        row: list[Any] = [metric, _pcts(entry["primary"]), _pcts(entry["candidate"])]
        if baseline:
            offset = _fmt(entry.get("baseline_ratio_p50"))
            row += [
                _pcts(entry.get("baseline")),
                f"{offset} {_ci(entry.get('baseline_ratio_p50_ci95'))}",
            ]
        row += [
            _fmt(judged.get("ratio_p50")),
            _ci(judged.get("ci95")),
            judged.get("n"),
            entry["verdict"],
        ]
        rows.append(row)
    lines += _table(head, rows)
    tolerance = summary["tolerance"]
    lines += [
        "",
        f"A latency difference counts when the whole 95% interval of candidate/{reference} "
        f"(paired bootstrap of the p50 ratio, on the requests where both have the value) lies "
        f"outside [1/{1 + tolerance:g}, {1 + tolerance:g}] and the p50s differ by at least "
        f"{summary['min_diff_ms']:g} ms; no verdict past {summary.get('max_error_rate', 0):g} "
        "failed requests of a target, or on too few pairs.",
        "",
    ]
    lines += [f"- {m}: {(summary[m].get('judged') or {}).get('reason', '-')}" for m in METRICS]
    return lines


def _pcts(p: Mapping[str, float] | None) -> str:
    if not p:
        return "-"
    n = f" ({p['n']})" if "n" in p else ""
    return f"{p['p50']:.4g} / {p['p90']:.4g} / {p['p99']:.4g}{n}"


# --------------------------------------------------------------------------- plots


#: The footer's type size (points) and a monospace glyph's width in ems.
FOOTER_POINTS = 7
_GLYPH_EMS = 0.65  # DejaVu Sans Mono: 0.62, and a margin


def command_footer(fig: Any, command: str) -> None:
    """The command that produced the figure, at its foot (leave the bottom 6% free),
    wrapped to the figure's width (at most three lines, the last cut with ...)."""
    width_points = fig.get_size_inches()[0] * 72 * 0.97  # less the 1% left margin
    columns = max(20, int(width_points / (FOOTER_POINTS * _GLYPH_EMS)) - 1)
    lines = textwrap.wrap(f"produced by: {command}", columns)
    if len(lines) > 3:
        lines = [*lines[:2], lines[2][: columns - 3] + "..."]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=FOOTER_POINTS, family="monospace", va="bottom")


def plot(out_dir: Path, tally: Tally, command: str) -> list[str]:
    """latency.png (ECDFs of TTFT, ITL and e2e per side) and divergence.png
    (histogram of first divergent positions, candidate and baseline side by
    side); returns the files written (none when nothing was replayed)."""
    if tally.replayed == 0:
        for name in (LATENCY_PNG, DIVERGENCE_PNG):  # no stale figure of an earlier run
            (out_dir / name).unlink(missing_ok=True)
        return []
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
    shown = []
    for side in sides[1:]:
        values = samples.column(f"divergence.{side}")
        values = values[~np.isnan(values)]
        if values.size:
            shown.append((side, values))
    drawn = bool(shown)
    if drawn:
        highest = max(float(v.max()) for _, v in shown)
        # Whole positions below 200: one bin each; above, 50 bins.
        bins: Any = np.arange(0, highest + 2) - 0.5 if highest < 200 else 50
        ax.hist(
            [v for _, v in shown],
            bins=bins,
            label=[f"{side} (n={v.size})" for side, v in shown],
            color=[_COLORS[side] for side, _ in shown],
        )  # several data sets: bars side by side within each bin, never stacked
        if highest < 200:  # positions are whole tokens: whole ticks
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlim(-0.5, max(highest, 1) + 0.5)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no divergent outputs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("first divergent position (token, or character without token ids)")
    ax.set_ylabel("requests")
    ax.set_title("Where outputs first differ from the primary's")
    command_footer(fig, command)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out_dir / DIVERGENCE_PNG, dpi=100)
    plt.close(fig)
    return [LATENCY_PNG, DIVERGENCE_PNG]
