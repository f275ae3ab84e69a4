"""The tap worker's regimes of the cost benchmark (issue 19), run by ``bench/proxy_bench.py``.

- ``scaling``: worker throughput on 2k-token prompts with 1 core (one shard, the
  proxy pinned to core 1) against 2 cores (two shards). The worker is stopped
  (SIGSTOP) while the requests are sent, so they wait in the hand-off; then it
  is resumed and timed until every record is published: nothing else runs
  meanwhile. Target: 2 cores >= 1.8x the throughput of 1.
- ``multiturn``: conversations of 10 to 30 turns growing to 8k-32k tokens,
  interleaved like agent traffic; the worker's CPU per request (main and shards)
  with incremental tokenization against a full re-encode
  (``worker.tokenizer_cache_bytes: 0``), and against the frontend's own CPU per
  request (run it with ``--frontend dynamo``). Each turn resends the bench's
  own answer text (8 tokens asked for), or with ``--answers frontend`` asks for
  that many tokens and resends what the frontend streamed, as agents do (the
  worker then finds each answer's ids from its record); ``--answers words``
  does the same with Dynamo's mocker streaming the bench's English replies
  (an output-replay trace) instead of random token ids. Targets: <= 0.3x the
  full re-encode, <= 0.6x the frontend (issue 34); the prompt-token mismatch
  metric stays 0. A ratio is judged on its rounds (``verdict``: a one-sided sign
  test at 5%, so 5 of 5 rounds, 7 of 8, ...): rounds on both sides of the bound
  are ``not judged``, whatever their median says.
- ``overload``: long prompts at a rate the worker, pinned with the proxy to
  one core, cannot follow: record lag p99 stays under ``worker.max_lag_s``
  (requests past it are dropped as ``late`` and counted), and the clients'
  latency does not move (two taps against none).
- ``hostile`` (issue 18): a paced load beside a stream of hostile requests, one
  a second: a 62 MB chat request of 600 tools x 1,000 properties and a 7 MiB
  prompt (both answered 400 by the frontend before it parses them, so that only
  the proxy pays for them), and a 0.9 MB gzip response that decodes to 256 MiB
  (3 million events), asked for with max_tokens 4 and without.
  The worker's peak RSS (main and shards, sampled every 0.2 s) stays within
  ``processes x worker.max_rss_mb`` + 512 MiB; the other clients' latency with
  two taps against none (both beside the hostile traffic) and their records'
  lag stay within the isolation bounds and twice a request's CPU budget.
  The load's senders start over one paced request's time (``LoadSpec.ramp_s``)
  and the hostile sender is under way before the measured load: started at once,
  the senders' first waves were every case's TTFT p99. ``<stem>-ttft.png`` draws
  each case's TTFT tail and round 1 as a timeline with the hostile requests marked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.worker_hostile import PLOT, hostile
from bench.worker_multiturn import multiturn
from bench.worker_overload import overload
from bench.worker_scaling import scaling

__all__ = ["PLOT", "markdown", "run", "verdict"]


async def run(regime: str, kind: str, args, scratch: Path) -> dict[str, Any]:
    regimes = {"scaling": scaling, "multiturn": multiturn, "overload": overload, "hostile": hostile}
    return await regimes[regime](kind, args, scratch)


def markdown(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    out = [
        f"## shadow-proxy bench: {result['regime']} ({result['started']})",
        "",
        f"Command: `{command}`  ",
        f"Commit: {m.get('commit', 'unknown')}  ",
        f"Machine: {m['cpu_model']}, {m['cores']} cores, load average at start "
        f"{m['loadavg_at_start']}",
        "",
    ]
    for part in result["parts"]:
        out.append(f"### {part['regime']}: {part['frontend']}")
        out.append("")
        out.append("| case | " + " | ".join(_keys(part["cases"])) + " |")
        out.append("|---|" + "---:|" * len(_keys(part["cases"])))
        for name, values in part["cases"].items():
            cells = [_cell(values.get(k)) for k in _keys(part["cases"])]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
        if part.get("plot"):
            out += [
                f"![time to first token: every round's tail, and round 1's timeline]"
                f"({part['plot']})",
                "",
            ]
        if part.get("ratios_per_round"):
            out.append("| per round | each round |")
            out.append("|---|---|")
            for what, ratios in part["ratios_per_round"].items():
                out.append(f"| {what} | {', '.join(_cell(r) for r in ratios)} |")
            out.append("")
        if part.get("lag"):
            out.append("| tap | record lag p99 s | published | dropped late |")
            out.append("|---|---:|---:|---:|")
            for tap, v in part["lag"].items():
                out.append(
                    f"| {tap} | {_cell(v['lag_p99_s'])} | {_cell(v['published'])} | "
                    f"{_cell(v['late'])} |"
                )
            out.append("")
        if part.get("hostile_sent"):
            out.append("| hostile request | answers (status: count) |")
            out.append("|---|---|")
            for what, statuses in part["hostile_sent"].items():
                answers = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
                out.append(f"| {what} | {answers} |")
            out.append("")
            out.append("| counted by the proxy (taps+hostile) | |")
            out.append("|---|---:|")
            out += [f"| {what} | {_cell(n)} |" for what, n in part["counted"].items()]
            out.append("")
        out.append("| target | measured | met |")
        out.append("|---|---:|---|")
        for label, value, bound, at_least, *rounds in part["targets"]:
            met = verdict(value, bound, at_least, rounds[0] if rounds else None)
            out.append(f"| {label} | {_cell(value)} | {met} |")
        out.append("")
    return "\n".join(out) + "\n"


def verdict(
    value: float | None, bound: float, at_least: bool, rounds: list[float] | None = None
) -> str:
    """``yes`` or ``**no**`` for a target; with the rounds' own values, a one-sided
    sign test on them at 5% (are the rounds on one side of the bound more often
    than chance?) or, when they cannot say, ``not judged`` and why. A median of
    rounds that straddle the bound is a coin flip, not a verdict."""
    if value is None:
        return "**no** (not measured)"
    if rounds is None:
        return "yes" if (value >= bound if at_least else value <= bound) else "**no**"
    n = len(rounds)
    if not n:
        return "not judged: no rounds"
    meet = sum(1 for r in rounds if (r >= bound if at_least else r <= bound))
    if _sign_test(meet, n) <= SIGN_TEST_P:
        return f"yes ({meet} of {n} rounds)"
    if _sign_test(n - meet, n) <= SIGN_TEST_P:
        return f"**no** ({n - meet} of {n} rounds miss)"
    spread = f"not judged: {meet} of {n} rounds meet it ({min(rounds):.3g}-{max(rounds):.3g})"
    need = next((k for k in range(n + 1) if _sign_test(k, n) <= SIGN_TEST_P), None)
    if need is None:
        least = next(k for k in range(n + 1, 64) if _sign_test(k, k) <= SIGN_TEST_P)
        return f"{spread}; {n} rounds cannot decide at 5%: --rounds {least} or more"
    return f"{spread}; a verdict at 5% needs {need} of {n} on one side"


#: The sign test's level: the chance that rounds whose true median sits on the
#: bound fall on one side this often.
SIGN_TEST_P = 0.05


def _sign_test(k: int, n: int) -> float:
    """P(at least ``k`` of ``n`` fair coin flips come up heads)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


def _keys(cases: dict[str, dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for values in cases.values():
        keys += [k for k, v in values.items() if isinstance(v, int | float) and k not in keys]
    return keys


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
