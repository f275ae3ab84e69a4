"""The bench's figures (matplotlib, Agg): what the tables say, to look at first.

``ttft`` draws a regime's time to first token: each case's tail (the fraction of
requests slower than x, on a log scale, where p99 is the 1% line), and, for each
case with traffic beside its load, its first round as a timeline: every request's
TTFT at the moment it was sent, with the side requests marked. It is how the
hostile regime's p99 was read (20261202): slow requests clustered where the 62 MB
bodies went through, with and without taps alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shadow_proxy.replay.report import command_footer

#: One colour per case, in the order the regime runs them.
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
_MARKS = ("black", "tab:red", "tab:purple", "tab:brown", "tab:olive")


def ttft(path: Path, data: dict[str, Any], command: str, title: str) -> Path:
    """Write ``path`` (a PNG) from ``data``: ``ttft_ms`` (case -> every TTFT, ms),
    ``timeline`` (case -> (sent s, TTFT ms) of its first round) and ``hostile_at``
    (case -> (kind, sent s) of the side requests in that round)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    from matplotlib import pyplot as plt

    cases = list(data["ttft_ms"])
    colour = {case: _COLOURS[i % len(_COLOURS)] for i, case in enumerate(cases)}
    beside = [case for case in cases if data["hostile_at"].get(case)]
    fig, axes = plt.subplots(
        1, 1 + len(beside), figsize=(6 + 5.5 * len(beside), 4.8), squeeze=False
    )
    tail = axes[0][0]
    for case in cases:
        values = np.sort(np.asarray(data["ttft_ms"][case]))
        if values.size:
            slower = 1.0 - np.arange(values.size) / values.size
            p99 = values[min(values.size - 1, int(0.99 * values.size))]
            tail.step(
                values,
                slower,
                where="post",
                color=colour[case],
                label=f"{case} (n={values.size}, p99 {p99:.0f} ms)",
            )
    tail.axhline(0.01, color="grey", lw=0.8, ls="--")
    tail.set_yscale("log")
    tail.set_xlabel("TTFT (ms)")
    tail.set_ylabel("fraction of requests slower")
    tail.set_title("TTFT tail, every round")
    tail.grid(alpha=0.3, which="both")
    tail.legend(fontsize=8, loc="upper right")
    kinds = list(dict.fromkeys(kind for case in beside for kind, _ in data["hostile_at"][case]))
    mark = {kind: _MARKS[i % len(_MARKS)] for i, kind in enumerate(kinds)}
    top = max((v for case in beside for _, v in data["timeline"][case]), default=1.0)
    for ax, case in zip(axes[0][1:], beside, strict=True):
        points = np.asarray(data["timeline"][case]).reshape(-1, 2)
        ax.scatter(points[:, 0], points[:, 1], s=3, color=colour[case], label="requests")
        labelled: set[str] = set()
        for kind, at in data["hostile_at"][case]:
            ax.axvline(
                at,
                color=mark[kind],
                lw=0.9,
                alpha=0.6,
                label=None if kind in labelled else f"sent: {kind}",
            )
            labelled.add(kind)
        ax.set_ylim(0, top * 1.05)
        ax.set_xlim(left=0)
        ax.set_xlabel("sent at (s from the start of round 1)")
        ax.set_ylabel("TTFT (ms)")
        ax.set_title(f"{case}, round 1")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
    fig.suptitle(title)
    command_footer(fig, command)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
