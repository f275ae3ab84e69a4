"""The reuse report for people: a terminal table and a PNG plot.

Runs once, after ``ReuseAnalysis.result``. The table fits 100 columns; the plot
(matplotlib, Agg backend, imported only when asked) shows the LRU hit rate against
cache size, in blocks and in tokens, one line per block size, and names the
command that produced it.
"""

from __future__ import annotations

from pathlib import Path

from shadow_proxy.trace.reuse import ALL, PERCENTILES, ReuseCurve


def _fmt_blocks(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def no_reuse(curves: dict[int, ReuseCurve]) -> str | None:
    """What to say when no block size shows any reuse (None when one does): an
    empty plot would otherwise read as a drawing fault."""
    if not curves or any(curve.hit_rate() > 0 for curve in curves.values()):
        return None
    sizes = ", ".join(str(size) for size in curves)
    label = "block sizes" if len(curves) > 1 else "block size"
    return (
        f"no prefix reuse at {label} {sizes}: no request shares a whole block of "
        "its prompt's start with an earlier one"
    )


def table(result: dict[str, dict[int, ReuseCurve]]) -> str:
    """One line per scope and block size."""
    head = f"{'model':<24} {'B':>5} {'requests':>9} {'prompt tok':>12} {'hit inf':>8} " + " ".join(
        f"{'p' + str(p) + ' blk':>10}" for p in PERCENTILES
    )
    lines = [head, "-" * len(head)]
    names = [ALL, *sorted(name for name in result if name != ALL)]
    for name in names:
        label = "(all)" if name == ALL else name
        if len(label) > 24:
            label = label[:23] + "…"
        for size, curve in result[name].items():
            lines.append(
                f"{label:<24} {size:>5} {curve.requests:>9,} {curve.prompt_tokens:>12,} "
                f"{curve.hit_rate():>8.1%} "
                + " ".join(f"{_fmt_blocks(curve.reuse_distance(p)):>10}" for p in PERCENTILES)
            )
    lines.append("hit inf: prefix-cache hit rate of an infinite cache;")
    lines.append("pN blk: LRU capacity in blocks that reaches N% of it")
    note = no_reuse(result.get(ALL, {}))
    if note:
        lines.append(note)
    return "\n".join(lines)


def plot(result: dict[str, dict[int, ReuseCurve]], path: Path, command: str) -> None:
    """Hit rate against LRU capacity (blocks, tokens), one line per block size."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import NullFormatter

    curves = result[ALL]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    right = 2 * max(
        (c.lru_points()[-1][0] * c.block_size for c in curves.values() if c.lru_points()), default=2
    )
    for size, curve in curves.items():
        points = curve.lru_points()
        xs = [1] + [int(p[0]) for p in points]
        ys = [0.0] + [p[1] for p in points]
        label = f"B={size} (infinite {curve.hit_rate():.1%})"
        for axis, scale in ((axes[0], 1), (axes[1], size)):
            scaled = [x * scale for x in xs]
            end = right / size if scale == 1 else right
            axis.step([*scaled, max(end, scaled[-1])], [*ys, ys[-1]], where="post", label=label)
    note = no_reuse(curves)
    for axis, unit in zip(axes, ("blocks", "tokens"), strict=True):
        axis.set_xscale("log")
        # Labelled decades only: minor labels (2x10^1, 3x10^1, ...) run into each other.
        axis.xaxis.set_minor_formatter(NullFormatter())
        if note:  # nothing to draw: say so, over the range the prompts' blocks span
            smallest = min(curves)
            prompt_blocks = max(c.prompt_tokens for c in curves.values()) // smallest
            scale = 1 if unit == "blocks" else smallest
            axis.set_xlim(scale, scale * max(10, prompt_blocks))
            axis.text(
                0.5,
                0.5,
                note.replace(": ", ":\n", 1),
                transform=axis.transAxes,
                ha="center",
                va="center",
                wrap=True,
            )
        axis.set_xlabel(f"LRU cache capacity ({unit})")
        axis.set_ylabel("prefix-cache hit rate (hit tokens / prompt tokens)")
        axis.set_ylim(0, 1)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(loc="upper left")
    requests = next(iter(curves.values())).requests if curves else 0
    shown = command if len(command) <= 160 else command[:157] + "..."
    fig.suptitle(
        f"KV prefix-cache reuse of {requests:,} requests (all models, exact LRU)\n{shown}",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
