"""The benchmark's Markdown: the machine, each regime's tables and targets, profiles."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.cases import CASE_TITLES
from bench.services import REPO
from shadow_proxy import allocator


def machine() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    packages = {}
    for name in ("aiohttp", "uvloop", "pyzmq", "tokenizers", "transformers", "msgpack"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            packages[name] = metadata.version(name)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([nginx, "-v"], capture_output=True, text=True, timeout=5)
        packages["nginx"] = out.stderr.strip().rpartition("/")[2]
    dynamo = sorted((REPO / ".dynamo" / "venv").glob("lib/python*/site-packages/ai_dynamo-*"))
    if dynamo:
        packages["ai-dynamo"] = dynamo[0].name.split("-")[1].removesuffix(".dist")
    # What the bench's proxies preload in their workers (worker.malloc: auto).
    packages["worker malloc"] = allocator.choose(allocator.AUTO)
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().split()[:3]
    return {
        "commit": commit(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": packages,
        "loadavg_at_start": " ".join(load),
    }


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=5, check=True
    )
    return done.stdout.strip()


def commit() -> str:
    """The commit a result was measured at (``-dirty``: with uncommitted changes)."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _f(value: Any, digits: int = 1) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: Any, base: Any) -> str:
    if not value or not base:
        return "-"
    return f"{value / base:.2f}"


def markdown(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    out = [f"## shadow-proxy bench: {result['regime']} ({result['started']})", ""]
    out.append(f"Command: `{command}`  ")
    out.append(f"Commit: {m.get('commit', 'unknown')}  ")
    out.append(
        f"Machine: {m['cpu_model']}, {m['cores']} cores, Linux {m['kernel']}, "
        f"Python {m['python']}, load average at start {m['loadavg_at_start']}; "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    )
    out.append("")
    for part in result["parts"]:
        out += _markdown_part(part)
    return "\n".join(out) + "\n"


def _markdown_part(part: dict[str, Any]) -> list[str]:
    out = [f"### {part['regime']}: {part['frontend']}", ""]
    out.append(
        f"Streaming chat, prompt ~{part['isl']} tokens, {part['osl']} output tokens, "
        f"{part['rounds']} alternating rounds (case order rotated), "
        f"{part['warmup_requests']} warm-up requests per case and round"
        + (
            f"; proxy/nginx and tap worker on core {part['pinned']['proxy_and_worker']}, "
            f"frontend, load generator and consumers on core {part['pinned']['others']}"
            if part["pinned"]
            else ""
        )
        + "."
    )
    out.append("")
    for table in part["tables"]:
        cases = table["cases"]
        base_name = "direct" if "direct" in cases else "taps"
        base = cases[base_name]
        roles = [
            r
            for r in ("frontend", "engine", "proxy", "worker", "loadgen")
            if any(r in c["cpu_s_per_1000"] for c in cases.values())
        ]
        out.append(
            f"Concurrency {table['concurrency']}, {table['requests']} requests per case "
            f"and round. Ratios are against `{base_name}`."
        )
        out.append("")
        head = [
            "case",
            "req/s",
            "ratio",
            "TTFT p50 ms",
            "ratio",
            "TTFT p99 ms",
            "ratio",
            "e2e p99 ms",
        ]
        if part["regime"].startswith("isolation"):
            head.append("loop lag p99 ms")
        head += [f"CPU s/1k {r}" for r in roles]
        head += ["RSS MB proxy", "RSS MB worker", "records / gaps per tap", "errors"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + "|")
        for name, c in cases.items():
            row = [
                CASE_TITLES[name],
                _f(c["requests_per_s"]),
                _ratio(c["requests_per_s"], base["requests_per_s"]),
                _f(c["ttft_p50_ms"]),
                _ratio(c["ttft_p50_ms"], base["ttft_p50_ms"]),
                _f(c["ttft_p99_ms"]),
                _ratio(c["ttft_p99_ms"], base["ttft_p99_ms"]),
                _f(c["e2e_p99_ms"]),
            ]
            if part["regime"].startswith("isolation"):
                row.append(_f(c["loop_lag_p99_ms"], 2))
            row += [_f(c["cpu_s_per_1000"].get(r), 2) for r in roles]
            row += [_f(c["rss_mb_peak"].get("proxy")), _f(c["rss_mb_peak"].get("worker"))]
            row.append(
                "; ".join(
                    f"{t.split('-')[0]} {s['records']}/{s['tap_gaps'] + s['tail_loss']}"
                    for t, s in c["consumers"].items()
                )
                or "-"
            )
            row.append(str(c["errors"]))
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out += _targets(part["regime"], cases)
    if part.get("profile"):
        out += _markdown_profile(part["profile"])
    return out


def _targets(regime: str, cases: dict[str, Any]) -> list[str]:
    checks = []
    if regime.startswith("isolation"):
        pairs = [(name, "proxy") for name in ("taps", "taps-stalled")]
        pairs += [(f"{name}+neighbour", "proxy+neighbour") for name in ("taps", "taps-stalled")]
        for name, against in pairs:
            if name not in cases or against not in cases:
                continue
            c, base = cases[name], cases[against]
            checks += [
                (
                    f"{name}: TTFT p50 / {against} <= 1.05",
                    c["ttft_p50_ms"],
                    base["ttft_p50_ms"],
                    1.05,
                    False,
                ),
                (
                    f"{name}: TTFT p99 / {against} <= 1.10",
                    c["ttft_p99_ms"],
                    base["ttft_p99_ms"],
                    1.10,
                    False,
                ),
                (
                    f"{name}: req/s / {against} >= 0.95",
                    c["requests_per_s"],
                    base["requests_per_s"],
                    0.95,
                    True,
                ),
            ]
    elif regime == "capacity":
        proxy, front = cases["proxy"], cases["direct"]["cpu_s_per_1000"]["frontend"]
        checks.append(
            (
                "no taps: req/s / nginx >= 0.95",
                proxy["requests_per_s"],
                cases["nginx"]["requests_per_s"],
                0.95,
                True,
            )
        )
        for name in ("proxy", "taps"):
            checks.append(
                (
                    f"{name}: serving-loop CPU / frontend CPU <= 0.25",
                    cases[name]["cpu_s_per_1000"]["proxy"],
                    front,
                    0.25,
                    False,
                )
            )
        checks.append(
            (
                "taps: worker CPU / frontend CPU <= 1.0",
                cases["taps"]["cpu_s_per_1000"].get("worker"),
                front,
                1.0,
                False,
            )
        )
    elif regime == "memory":
        a, s = cases["taps"]["rss_mb_peak"], cases["taps-stalled"]["rss_mb_peak"]
        return [
            f"Peak RSS growth with stalled consumers over reading ones: proxy "
            f"{_f(s.get('proxy', 0) - a.get('proxy', 0))} MB, worker "
            f"{_f(s.get('worker', 0) - a.get('worker', 0))} MB.",
            "",
        ]
    if not checks:
        return []
    out = ["| target | ratio | met |", "|---|---:|---|"]
    for label, value, base, bound, at_least in checks:
        if not value or not base:
            out.append(f"| {label} | - | - |")
            continue
        ratio = value / base
        met = ratio >= bound if at_least else ratio <= bound
        out.append(f"| {label} | {ratio:.3f} | {'yes' if met else '**no**'} |")
    return [*out, ""]


def _markdown_profile(profile: dict[str, Any]) -> list[str]:
    out = [
        "py-spy (`record --nonblocking --rate 200`, one unmeasured run of case 4), "
        "share of on-CPU samples:",
        "",
    ]
    for role, p in profile.items():
        if "error" in p:
            out += [f"{role}: {p['error']}", ""]
            continue
        out += [
            f"**{role}** ({p['samples']} samples)",
            "",
            "| self % | function | inclusive % | function |",
            "|---:|---|---:|---|",
        ]
        for (fs, vs), (fi, vi) in zip(p["self"], p["inclusive"], strict=False):
            out.append(f"| {vs} | `{fs}` | {vi} | `{fi}` |")
        out.append("")
    return out
