"""How a replay run ends on the command line: the headline printed last (the
counts, then the TTFT verdict with what it judged) and, when the run has
nothing to show, the exit status and the one line that says why."""

from __future__ import annotations

from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2


def headline(summary: dict[str, Any]) -> str:
    """The last line: the counts, then the TTFT verdict with what it judged."""
    ttft = summary["ttft_ms"]
    judged = ttft.get("judged") or {}
    ratio, ci = judged.get("ratio_p50"), judged.get("ci95")
    shown = "-" if ratio is None else f"{ratio:.3g}"
    interval = "" if not ci else f" [{ci[0]:.3g}, {ci[1]:.3g}]"
    return (
        f"records={summary['records']} replayed={summary['replayed']} "
        f"skipped={sum(summary['skipped'].values())} errors={summary['errors']} "
        f"exact_match_rate={summary['exact_match_rate']} "
        f"ttft candidate/{judged.get('reference', ttft.get('judged_against'))} "
        f"p50={shown}{interval} n={judged.get('n', 0)}: {ttft['verdict']}"
    )


def nothing_to_show(summary: dict[str, Any]) -> tuple[int, str] | None:
    """An exit status and its line when the run has nothing to show: no
    records, none replayed, or every request to a target failed."""
    skipped = summary["skipped"]
    if summary["records"] == 0:
        unreadable = sum((summary["run"].get("unreadable") or {}).values())
        extra = f" ({unreadable} unreadable entries)" if unreadable else ""
        return EXIT_USAGE, f"no records in the source{extra}"
    if summary["replayed"] == 0 and summary["run"]["complete"]:
        why = ", ".join(f"{k} {v}" for k, v in skipped.items())
        hint = (
            " (request-only records: --no-compare replays them for load)"
            if "no_response" in skipped
            else ""
        )
        return EXIT_USAGE, f"no record could be replayed: {why}{hint}"
    failed = [
        target
        for target, count in (
            ("candidate", summary["errors"]),
            ("baseline", summary.get("baseline_errors", 0)),
        )
        if summary["replayed"] and count == summary["replayed"]
    ]
    if failed:
        examples = summary.get("error_examples") or summary.get("baseline_error_examples") or []
        first = f": {examples[0]['message']}" if examples else ""
        return EXIT_FAILED, (
            f"every request to the {' and the '.join(failed)} failed "
            f"({summary['replayed']} of {summary['replayed']}){first}"
        )
    return None
