"""The multi-turn run's reuse summary, and the checks that its records hold the
conversations.

``add_reuse`` runs once, after the multi-turn run's proxy run (``run.py``),
on the record files its consumers kept. It

- reads the records back: the ``shadow-replay`` records carry each request's
  session (``request.agent_context.session_id``, from the
  ``x-dynamo-session-id`` header the conversations send; the
  ``kv-history-tracker`` tap is ``tokens-only`` and strips it), the
  ``kv-history-tracker`` records its token ids; within each session, in
  arrival order, every turn's token ids must start with the previous turn's
  (the history is resent whole);
- runs ``shadow-trace analyze`` on the ``kv-history-tracker`` records
  (``--block-size 16,64 --json``) and keeps, per block size, the requests,
  prompt tokens, the infinite cache's hit rate and the LRU hit rate at
  ``CAPACITIES_TOKENS`` (a cache of that many tokens: ``tokens // B`` blocks).

It adds ``sessions`` and ``reuse`` to the run's result, the tool's exit status
to ``exit_status``, and a failure line for each thing that does not hold: the
analysis must see every record and as many prompt tokens as the frontend
reports, every conversation must be one session with all its turns, and no
turn may fail to extend its previous one. ``format_reuse`` is the summary's
text.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from shadow_proxy.devtools.demo.services import run_tool
from shadow_proxy.devtools.demo.table import number
from shadow_proxy.devtools.reference_taps import JOINED_TAP, REQUEST_TAP
from shadow_proxy.records.files import read_payloads
from shadow_proxy.records.wire import WireError, decode_envelope

BLOCK_SIZES = (16, 64)
#: LRU cache sizes shown, in tokens.
CAPACITIES_TOKENS = (4096, 8192, 16384, 32768)
ANALYZE_TIMEOUT_S = 120.0


def _envelopes(path: Path) -> list[dict[str, Any]]:
    out = []
    for payload in read_payloads(path) if path.exists() else []:
        try:
            out.append(decode_envelope(payload))
        except WireError:
            continue
    return out


def session_structure(
    joined: list[dict[str, Any]], requests: list[dict[str, Any]]
) -> dict[str, Any]:
    """Sessions and turns as the records show them: the joined records' session
    ids, and whether each turn's token ids (request records) extend the previous
    turn's in the same session, in arrival order."""
    tokens = {r.get("request_id"): (r.get("request") or {}).get("token_ids") for r in requests}
    by_session: dict[str, list[tuple[int, str | None]]] = defaultdict(list)
    without = 0
    for record in joined:
        context = (record.get("request") or {}).get("agent_context") or {}
        session = context.get("session_id") if isinstance(context, dict) else None
        if not isinstance(session, str) or not session:
            without += 1
            continue
        by_session[session].append((record.get("arrival_unix_ns", 0), record.get("request_id")))
    not_extending: list[str] = []
    unmatched = 0
    for turns in by_session.values():
        turns.sort()
        previous: list[int] | None = None
        for _arrival, request_id in turns:
            ids = tokens.get(request_id)
            if not isinstance(ids, list):
                unmatched += 1
                previous = None
                continue
            if previous is not None and not (
                len(ids) > len(previous) and ids[: len(previous)] == previous
            ):
                not_extending.append(str(request_id))
            previous = ids
    counts = sorted({len(t) for t in by_session.values()})
    return {
        "sessions": len(by_session),
        "turns_per_session": counts,
        "records_without_session": without,
        "turns_without_request_record": unmatched,
        "turns_not_extending": len(not_extending),
        "first_not_extending": not_extending[:3],
    }


def lru_rate(points: list[list[float]], capacity_blocks: int) -> float:
    """The LRU hit rate at ``capacity_blocks`` from ``[capacity, rate]`` points
    (the rate of the last point at or below it; 0 before the first)."""
    rate = 0.0
    for capacity, value in points:
        if capacity > capacity_blocks:
            break
        rate = value
    return rate


def reuse_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per block size: requests, prompt tokens, infinite and LRU hit rates."""
    rows = []
    for size, curve in sorted(document.get("all", {}).items(), key=lambda kv: int(kv[0])):
        block = int(size)
        rows.append(
            {
                "block_size": block,
                "requests": curve["requests"],
                "prompt_tokens": curve["prompt_tokens"],
                "hit_rate_infinite": curve["hit_rate_infinite"],
                "lru": {
                    str(tokens): lru_rate(curve["lru"], tokens // block)
                    for tokens in CAPACITIES_TOKENS
                },
            }
        )
    return rows


async def add_reuse(result: dict[str, Any], out_dir: Path, log_dir: Path) -> None:
    """Analyze the multi-turn run's records; adds ``sessions``, ``reuse`` and
    the failures to ``result`` (see the module docstring)."""
    request_file = Path(result["records"][REQUEST_TAP])
    joined_file = Path(result["records"][JOINED_TAP])
    sessions = session_structure(_envelopes(joined_file), _envelopes(request_file))
    json_path = out_dir / "reuse.json"
    args = [
        "analyze",
        str(request_file),
        "--block-size",
        ",".join(map(str, BLOCK_SIZES)),
        "--json",
        str(json_path),
    ]
    tool = await run_tool(
        "shadow-trace",
        [sys.executable, "-m", "shadow_proxy.trace.cli", *args],
        log_dir,
        ANALYZE_TIMEOUT_S,
    )
    result["exit_status"]["shadow-trace"] = tool.exit_status
    try:
        document = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        document = {}
    rows = reuse_rows(document)
    result["sessions"] = sessions
    result["reuse"] = {
        "command": shlex.join(["shadow-trace", *args]),
        "json": str(json_path),
        "block_sizes": rows,
    }
    failures = reuse_failures(result)
    if tool.exit_status != 0:
        failures.append(
            f"shadow-trace exited with status {tool.exit_status}: {tool.output_tail(3)}"
        )
    result["failures"] += failures
    result["ok"] = not result["failures"]


def reuse_failures(result: dict[str, Any]) -> list[str]:
    """Why the multi-turn run's sessions or reuse summary do not hold."""
    failures = []
    load, sessions = result["load"], result["sessions"]
    records = (result["taps"].get(REQUEST_TAP) or {}).get("records")
    expected_tokens = result["clients"]["frontend_prompt_tokens"]
    rows = result["reuse"]["block_sizes"]
    if not rows:
        failures.append("shadow-trace analyze wrote no reuse figures")
    for row in rows:
        if row["requests"] != records:
            failures.append(
                f"reuse (block {row['block_size']}): {row['requests']} requests "
                f"analyzed, the tap holds {records} records"
            )
        if row["prompt_tokens"] != expected_tokens:
            failures.append(
                f"reuse (block {row['block_size']}): {row['prompt_tokens']} prompt "
                f"tokens analyzed, the frontend reports {expected_tokens}"
            )
    if sessions["sessions"] != load["conversations"] or sessions["turns_per_session"] != [
        load["turns"]
    ]:
        failures.append(
            f"{JOINED_TAP} records: {sessions['sessions']} sessions with "
            f"{sessions['turns_per_session']} turns, the clients held "
            f"{load['conversations']} conversations of {load['turns']} turns"
        )
    for key in ("records_without_session", "turns_without_request_record"):
        if sessions[key]:
            failures.append(f"{key.replace('_', ' ')}: {sessions[key]}")
    if sessions["turns_not_extending"]:
        failures.append(
            f"{sessions['turns_not_extending']} turns do not extend their previous turn's "
            f"prompt (e.g. {', '.join(sessions['first_not_extending'])})"
        )
    return failures


def format_reuse(result: dict[str, Any]) -> str:
    """The reuse summary of the multi-turn run, as text."""
    sessions, reuse = result["sessions"], result["reuse"]
    rows = reuse["block_sizes"]
    head = ["block", "requests", "prompt tok", "infinite cache"]
    head += [f"LRU {number(tokens)} tok" for tokens in CAPACITIES_TOKENS]
    grid = [head]
    for row in rows:
        grid.append(
            [
                str(row["block_size"]),
                number(row["requests"]),
                number(row["prompt_tokens"]),
                f"{row['hit_rate_infinite']:.1%}",
                *(f"{row['lru'][str(t)]:.1%}" for t in CAPACITIES_TOKENS),
            ]
        )
    widths = [max(len(r[i]) for r in grid) for i in range(len(head))]
    lines = [
        "",
        f"KV-cache reuse of the {REQUEST_TAP} records (prefix-cache hit rate: hit tokens "
        "/ prompt tokens)",
    ]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in grid]
    turns = "/".join(map(str, sessions["turns_per_session"])) or "0"
    extend = (
        "every turn's prompt extends the previous turn's"
        if not sessions["turns_not_extending"]
        else f"{sessions['turns_not_extending']} turns do NOT extend the previous turn's prompt"
    )
    lines += [
        f"  sessions {sessions['sessions']} x {turns} turns ({JOINED_TAP} records' session ids); "
        f"{extend} ({REQUEST_TAP} token ids)",
        f"  {reuse['command']}",
    ]
    return "\n".join(lines)
