"""The replay run: a run's captured traffic replayed to a changed deployment.

``replay_run`` runs once, at the end of the demo, after the run it replays. It
starts two more built-in frontends, a candidate (the primary's pacing plus
``extra_ttft_ms`` and ``extra_itl_ms``, and its output diverging from token
``diverge_at`` on for ``diverge_fraction`` of the requests, chosen by request
id) and a baseline (the primary's twin: the noise floor), runs
``shadow-replay`` on the joined tap's record file of that run (what its
consumer kept with ``--record``) at ``--speed max``, reads the report's
``summary.json`` and stops both frontends.

It checks what the candidate was told to do against what the report says:
every record replayed, none skipped, no error (candidate and baseline), no
prompt-token mismatch; the exact-match rate equals the share of the records
whose request id the candidate's divergence rule picks
(``frontend.config.diverges``), every divergence is at ``diverge_at`` and
counted against the baseline; a slower TTFT and ITL are judged ``higher``;
every process exits with status 0. ``format_replay`` is the run's table.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from shadow_proxy.devtools.demo.runs import ReplayPlan
from shadow_proxy.devtools.demo.services import FrontendKnobs, builtin_frontends, run_tool
from shadow_proxy.devtools.demo.table import grid, number
from shadow_proxy.devtools.frontend.config import diverges
from shadow_proxy.devtools.reference_taps import JOINED_TAP
from shadow_proxy.records.files import read_payloads
from shadow_proxy.records.wire import WireError, decode_envelope

REPLAY_TIMEOUT_S = 300.0
LATENCIES = (("ttft_ms", "TTFT"), ("itl_ms", "ITL (mean per request)"), ("e2e_ms", "end-to-end"))


def request_ids(path: Path) -> list[str]:
    """The request ids of a record file, in file order."""
    ids = []
    for payload in read_payloads(path):
        try:
            ids.append(str(decode_envelope(payload).get("request_id")))
        except WireError:
            continue
    return ids


def near(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (the
    command the demo prints reads ``.models/deepseek``, not a machine's layout)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


async def replay_run(
    plan: ReplayPlan,
    source: dict[str, Any],
    models: dict[str, Path],
    primary: FrontendKnobs,
    tokenizer: Path,
    out_dir: Path,
    log_dir: Path,
) -> dict[str, Any]:
    """Replay ``source`` (a run's result) to a candidate and a baseline; the result."""
    started = time.monotonic()
    record_file = Path(source["records"][JOINED_TAP])
    ids = request_ids(record_file)
    diverging = sum(diverges(i, plan.diverge_fraction) for i in ids)
    candidate = FrontendKnobs(
        primary.ttft_ms + plan.extra_ttft_ms,
        primary.itl_ms + plan.extra_itl_ms,
        plan.diverge_fraction,
        plan.diverge_at,
    )
    knobs = {"candidate": candidate, "baseline": primary}
    report_dir = out_dir / "replay"
    statuses: dict[str, int] = {}
    async with builtin_frontends(models, knobs, log_dir, statuses) as urls:
        args = [
            str(record_file),
            "--candidate",
            urls["candidate"],
            "--baseline",
            urls["baseline"],
            "--out",
            str(report_dir),
            "--speed",
            "max",
            "--concurrency",
            str(plan.concurrency),
            "--tokenizer",
            near(tokenizer),
        ]
        mark = time.monotonic()
        tool = await run_tool(
            "shadow-replay",
            [sys.executable, "-m", "shadow_proxy.replay.cli", *args],
            log_dir,
            REPLAY_TIMEOUT_S,
        )
        replay_s = time.monotonic() - mark
    try:
        summary = json.loads((report_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {}
    result: dict[str, Any] = {
        "title": plan.title,
        "kind": plan.kind,
        "source": {
            "run": plan.source_run,
            "title": source["title"],
            "records_file": str(record_file),
            "records": len(ids),
        },
        "candidate": {
            "knobs": candidate.describe(),
            "extra_ttft_ms": plan.extra_ttft_ms,
            "extra_itl_ms": plan.extra_itl_ms,
        },
        "baseline": {"knobs": primary.describe()},
        "concurrency": plan.concurrency,
        "expected": {
            "diverging": diverging,
            "exact_match_rate": round((len(ids) - diverging) / len(ids), 6) if ids else None,
            "diverge_at": plan.diverge_at,
        },
        "summary": summary,
        "command": shlex.join(["shadow-replay", *args]),
        "report": str(report_dir / "report.md"),
        "exit_status": {**statuses, "shadow-replay": tool.exit_status},
        "timings_s": {
            "replay_s": round(replay_s, 2),
            "total_s": round(time.monotonic() - started, 2),
        },
    }
    result["failures"] = replay_failures(result)
    if tool.exit_status != 0:
        result["failures"].append(f"shadow-replay: {tool.output_tail(3)}")
    result["ok"] = not result["failures"]
    return result


def replay_failures(result: dict[str, Any]) -> list[str]:
    """Why the replay's report does not show what the candidate was told to do."""
    summary, expected = result["summary"], result["expected"]
    records = result["source"]["records"]
    if not summary:
        return ["shadow-replay wrote no summary.json"]
    failures = []
    if summary.get("records") != records or summary.get("replayed") != records:
        failures.append(
            f"shadow-replay read {summary.get('records')} records and replayed "
            f"{summary.get('replayed')}; the file holds {records}"
        )
    for key in (
        "errors",
        "baseline_errors",
        "prompt_token_mismatches",
        "baseline_prompt_token_mismatches",
    ):
        if summary.get(key):
            failures.append(f"shadow-replay: {key} = {summary[key]}")
    if any((summary.get("skipped") or {}).values()):
        failures.append(f"shadow-replay skipped records: {summary['skipped']}")
    if summary.get("exact_match_rate") != expected["exact_match_rate"]:
        failures.append(
            f"exact-match rate {summary.get('exact_match_rate')}; the candidate diverges on "
            f"{expected['diverging']} of {records} request ids "
            f"(rate {expected['exact_match_rate']})"
        )
    counted = ((summary.get("differences") or {}).get("output") or {}).get("counted")
    if counted != expected["diverging"]:
        failures.append(
            f"{counted} output differences counted against the baseline, "
            f"{expected['diverging']} expected"
        )
    if expected["diverging"]:
        first = summary.get("first_divergence") or {}
        at = float(expected["diverge_at"])
        if (first.get("p50"), first.get("p99")) != (at, at):
            failures.append(
                f"first divergent position {first}, the candidate diverges at "
                f"token {expected['diverge_at']}"
            )
    for metric, extra in (("ttft_ms", "extra_ttft_ms"), ("itl_ms", "extra_itl_ms")):
        verdict = (summary.get(metric) or {}).get("verdict")
        want = "higher" if result["candidate"][extra] > 0 else None
        if want and verdict != want:
            failures.append(
                f"{metric} verdict {verdict!r}: the candidate is "
                f"{result['candidate'][extra]:g} ms slower"
            )
    for name, status in result["exit_status"].items():
        if status != 0:
            failures.append(f"{name} exited with status {status}")
    return failures


def _ms(block: dict[str, Any] | None, side: str) -> str:
    value = ((block or {}).get(side) or {}).get("p50")
    return number(float(value)) if value is not None else "-"


def _position(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else number(float(value))


def format_replay(result: dict[str, Any]) -> str:
    """The replay run as plain text: the setup, latencies with verdicts, outputs."""
    source, summary, expected = result["source"], result["summary"], result["expected"]
    lines = [
        f"== replay: the {source['records']} {JOINED_TAP} records of run {source['run']} "
        f"({source['title']}), shadow-replay --speed max, concurrency {result['concurrency']}",
        f"   candidate: built-in, {result['candidate']['knobs']} (the primary "
        f"+{result['candidate']['extra_ttft_ms']:g} ms TTFT, "
        f"+{result['candidate']['extra_itl_ms']:g} ms ITL)",
        f"   baseline:  built-in, {result['baseline']['knobs']} (the primary's twin: the "
        "noise floor)",
        "",
    ]
    lines.append("latency")
    rows = [["p50 ms", "primary", "baseline", "candidate", "candidate/baseline", "verdict"]]
    for metric, label in LATENCIES:
        block = summary.get(metric)
        ratio = (block or {}).get("candidate_vs_baseline_p50")
        rows.append(
            [
                label,
                _ms(block, "primary"),
                _ms(block, "baseline"),
                _ms(block, "candidate"),
                f"{ratio:.2f}x" if ratio is not None else "-",
                str((block or {}).get("verdict", "-")),
            ]
        )
    lines += grid(rows, right=range(1, 5))
    rate = summary.get("exact_match_rate")
    first = summary.get("first_divergence") or {}
    skipped = sum((summary.get("skipped") or {}).values())
    lines += ["", "outputs and accounting"]
    lines += grid(
        [
            [
                "records / replayed / skipped / errors",
                f"{number(summary.get('records'))} / {number(summary.get('replayed'))} / "
                f"{number(skipped)} / {number(summary.get('errors'))}",
            ],
            [
                "exact match (candidate vs primary)",
                (f"{rate:.1%}" if rate is not None else "-")
                + f"  ({expected['diverging']} request ids picked to diverge)",
            ],
            [
                "first divergent position p50 / p99",
                f"{_position(first.get('p50'))} / {_position(first.get('p99'))}",
            ],
            ["prompt-token mismatches", number(summary.get("prompt_token_mismatches"))],
        ]
    )
    lines += [
        "",
        f"report  {result['report']}",
        f"  {result['command']}",
        "timings  "
        + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in result["timings_s"].items()),
    ]
    if result["ok"]:
        lines.append(
            "OK: every record replayed; the slower candidate and its divergences show as "
            "configured; every process stopped with status 0"
        )
    else:
        lines.append("FAILED:")
        lines += [f"  - {failure}" for failure in result["failures"]]
    return "\n".join(lines)
