"""The demo: ``shadow-proxy demo`` (what ``make demo`` runs).

One run starts, each as its own process, the built-in frontend (unless
``--frontend URL`` names a running one), the proxy with the two taps of the
reference deployment (``devtools/reference_taps.py``) and one
consumer per tap; then it sends the load from this process
(``shadow_proxy.devtools.loadgen``), waits until every record has reached its consumer,
stops every process with SIGTERM and prints one table: what the clients saw,
what the proxy's ``/metrics`` say and each consumer's totals.

The run is checked: every tap holds one record per request sent, with no gap
and no tail loss; each tap's prompt tokens equal what the frontend reports
(``usage.prompt_tokens`` of the answers, and for requests the client cancelled,
the frontend's count asked afterwards with the same prompt sent straight to it);
the joined tap's outcomes are ``cancelled`` exactly for the requests the
clients cancelled and ``complete`` for the rest; the proxy counts no
prompt-token mismatch and no drop; every process exits with status 0. The exit
status is 0 when all of this holds, 1 otherwise (the table says why).

Without options the three reference runs go one after the other (200 requests,
ISL 512, OSL 32: streaming; not streaming; streaming with 25% cancelled by the
client), the built-in frontend shared by the three.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import attrs

from shadow_proxy.devtools.loadgen import LoadSpec, Report, make_body, run_load
from shadow_proxy.devtools.processes import (
    Child,
    ChildExited,
    WaitTimeout,
    cli_argv,
    describe_failures,
    reserve_endpoint,
    reserve_port,
    wait_until,
)
from shadow_proxy.devtools.reference_taps import (
    TAP_NAMES,
    proxy_config,
    reference_taps,
    write_config,
)

#: Start-up budget of one process (the proxy's tap worker loads tokenizers).
STARTUP_TIMEOUT_S = 90.0
#: How long the taps and the consumers may take to catch up after the load.
SETTLE_TIMEOUT_S = 15.0
#: How long a process may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0
#: The consumers' summary-file interval and heartbeat grace.
CONSUMER_INTERVAL_S = 0.2
CONSUMER_GRACE_S = 1.0
POLL_S = 0.05
TAIL_LINES = 12


class DemoError(RuntimeError):
    """A run could not be carried out (a process failed, a wait timed out)."""


@attrs.frozen
class RunOptions:
    """One run: the load and where it goes."""

    title: str
    requests: int
    concurrency: int
    isl: int
    osl: int
    stream: bool
    cancel_fraction: float
    model: str
    tokenizer: Path


def reference_runs(args: argparse.Namespace) -> list[RunOptions]:
    """The three reference runs, with the load shape given on the command line."""
    shape = _shape(args)
    return [
        RunOptions("streaming", stream=True, cancel_fraction=0.0, **shape),
        RunOptions("non-streaming", stream=False, cancel_fraction=0.0, **shape),
        RunOptions("streaming, 25% cancelled", stream=True, cancel_fraction=0.25, **shape),
    ]


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "isl": args.isl,
        "osl": args.osl,
        "model": args.model,
        "tokenizer": args.tokenizer,
    }


# --------------------------------------------------------------------------- processes


async def _wait_until(
    what: str,
    check: Callable[[], Any],
    children: Sequence[Child],
    timeout: float,
    *,
    fatal: bool = True,
) -> Any:
    """Poll the coroutine function ``check`` until it returns a truthy value.

    Raises ``ChildExited`` when a child exits, ``WaitTimeout`` when ``timeout``
    passes (unless not ``fatal``: then it says so on stderr and returns None).
    """
    try:
        return await wait_until(check, timeout, POLL_S, what=what, children=children)
    except WaitTimeout as e:
        if fatal:
            raise
        print(f"demo: {e}; counting what arrived", file=sys.stderr)
        return None


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    """The JSON at ``url``, or None if it cannot be had (yet)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
            if response.status != 200:
                return None
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- the frontend


@contextlib.asynccontextmanager
async def builtin_frontend(
    models: dict[str, Path], ttft_ms: float, itl_ms: float, log_dir: Path
) -> Any:
    """Run ``shadow-proxy mock-frontend`` on a free port; yields its base URL."""
    port = reserve_port()
    argv = cli_argv("mock-frontend", "--host", "127.0.0.1", "--port", str(port))
    for name, path in models.items():
        argv += ["--model", f"{name}={path}"]
    argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    child = Child("frontend", argv, log_dir)
    url = f"http://127.0.0.1:{port}"
    child.start()
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_until(
                "the built-in frontend answering /health",
                lambda: _get_json(session, url + "/health"),
                [child],
                STARTUP_TIMEOUT_S,
            )
        yield url
    except Exception:
        _print_tails([child])
        raise
    finally:
        status = await child.stop(STOP_TIMEOUT_S)
        if status != 0:
            print(f"demo: the built-in frontend exited with status {status}", file=sys.stderr)


async def check_frontend(url: str, model: str) -> None:
    """Fail early, saying why, when a given frontend does not answer or does
    not serve ``model``."""
    async with aiohttp.ClientSession() as session:
        listing = await _get_json(session, url + "/v1/models")
    if listing is None:
        msg = f"the frontend at {url} does not answer GET /v1/models"
        raise DemoError(msg)
    data = listing.get("data") if isinstance(listing, dict) else None
    served = [m.get("id") for m in data or [] if isinstance(m, dict)]
    if served and model not in served:
        msg = f"the frontend at {url} does not serve {model!r} (it serves {served}); pass --model"
        raise DemoError(msg)


# --------------------------------------------------------------------------- one run


def run_config(
    run: RunOptions, frontend: str, listen_port: int, endpoints: Sequence[str]
) -> dict[str, Any]:
    """The proxy's configuration: the reference taps, on loopback endpoints."""
    return proxy_config(
        frontend,
        port=listen_port,
        models={run.model: run.tokenizer},
        taps=reference_taps(endpoints),
        shutdown_grace_s=5,
    )


async def frontend_prompt_tokens(
    frontend: str, spec: LoadSpec, report: Report
) -> tuple[int, int, int]:
    """What the frontend reports as prompt tokens, over every request sent.

    Answers that carried ``usage`` count as they are. A request without it (the
    client cancelled it, or it failed) is sent again with the same prompt,
    straight to the frontend (not through the proxy), unary, for one token, and
    its ``usage.prompt_tokens`` counts. Returns (total, requests asked again,
    requests still without a count).
    """
    total = sum(r.usage.get("prompt_tokens", 0) for r in report.results if r.usage)
    missing = [r.index for r in report.results if not r.usage]
    if not missing:
        return total, 0, 0
    probe = attrs.evolve(spec, url=frontend, stream=False, output_tokens=1, cancel_fraction=0.0)
    path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
    limit = asyncio.Semaphore(max(1, min(8, spec.concurrency)))
    uncounted = 0

    async def ask(session: aiohttp.ClientSession, index: int) -> int | None:
        async with limit:
            try:
                async with session.post(
                    frontend + path,
                    data=make_body(probe, index),
                    headers={"Content-Type": "application/json", **spec.headers},
                ) as response:
                    body = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None
        usage = body.get("usage") if isinstance(body, dict) else None
        count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return count if type(count) is int else None

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        counts = await asyncio.gather(*(ask(session, i) for i in missing))
    for count in counts:
        if count is None:
            uncounted += 1
        else:
            total += count
    return total, len(missing) - uncounted, uncounted


async def run_once(run: RunOptions, frontend: str, log_dir: Path) -> dict[str, Any]:
    """One run in front of ``frontend``: a fresh proxy and fresh consumers."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    listen_port = reserve_port()
    endpoints = [reserve_endpoint() for _ in TAP_NAMES]
    config = run_config(run, frontend, listen_port, endpoints)
    config_path = write_config(log_dir / "proxy.yaml", config)
    proxy_url = f"http://127.0.0.1:{listen_port}"
    proxy = Child("proxy", cli_argv("serve", "--config", str(config_path)), log_dir)
    consumers: dict[str, Child] = {}
    summaries: dict[str, Path] = {}
    for tap in config["taps"]:
        name = tap["name"]
        summaries[name] = log_dir / f"consumer-{name}.json"
        argv = cli_argv(
            "consumer",
            "--endpoint", tap["endpoint"],
            "--topic", tap["topic"],
            "--summary-path", str(summaries[name]),
            "--interval", str(CONSUMER_INTERVAL_S),
            "--grace", str(CONSUMER_GRACE_S),
        )  # fmt: skip
        consumers[name] = Child(f"consumer-{name}", argv, log_dir)
    children = [proxy, *consumers.values()]
    try:
        async with aiohttp.ClientSession() as session:
            # The consumers connect first (ZeroMQ reconnects until the proxy binds).
            for child in consumers.values():
                child.start()
            proxy.start()
            await _wait_until(
                "the proxy answering /healthz",
                lambda: _get_json(session, proxy_url + "/healthz"),
                children,
                STARTUP_TIMEOUT_S,
            )

            async def subscribed() -> bool:
                loaded = [_read_summary(p) for p in summaries.values()]
                return all(s is not None and s.get("heartbeats", 0) > 0 for s in loaded)

            await _wait_until(
                "each consumer seeing its tap's heartbeat", subscribed, children, STARTUP_TIMEOUT_S
            )
            timings["startup_s"] = time.monotonic() - started

            spec = LoadSpec(
                url=proxy_url,
                model=run.model,
                requests=run.requests,
                concurrency=run.concurrency,
                prompt_tokens=run.isl,
                output_tokens=run.osl,
                stream=run.stream,
                cancel_fraction=run.cancel_fraction,
            )
            mark = time.monotonic()
            report = await run_load(spec)
            timings["load_s"] = time.monotonic() - mark

            mark = time.monotonic()
            sent = len(report.results)
            listing = await _wait_until(
                f"the taps publishing a record for each of the {sent} requests",
                lambda: _taps_settled(session, proxy_url, sent),
                children,
                SETTLE_TIMEOUT_S,
                fatal=False,
            ) or await _tap_listing(session, proxy_url)
            if not listing:
                msg = "the proxy's /shadow/taps lists no tap counters"
                raise DemoError(msg)
            next_seq = {t["name"]: t["next_seq"] for t in listing}
            await _consumers_settled(summaries, next_seq, children)
            metrics_text = await _get_text(session, proxy_url + "/metrics")
            timings["settle_s"] = time.monotonic() - mark
        prompt_total, asked, uncounted = await frontend_prompt_tokens(frontend, spec, report)

        mark = time.monotonic()
        exits = {}
        for child in consumers.values():
            exits[child.name] = await child.stop(STOP_TIMEOUT_S)
        exits["proxy"] = await proxy.stop(STOP_TIMEOUT_S)
        timings["stop_s"] = time.monotonic() - mark
        timings["total_s"] = time.monotonic() - started
        taps = {name: _read_summary(path) or {} for name, path in summaries.items()}
    except Exception:
        _print_tails(children)
        raise
    finally:
        for child in children:
            child.kill()

    clients = report.summary()
    clients["frontend_prompt_tokens"] = prompt_total
    clients["prompt_tokens_asked_again"] = asked
    clients["prompt_tokens_uncounted"] = uncounted
    result = {
        "title": run.title,
        "load": {
            "requests": run.requests,
            "concurrency": run.concurrency,
            "isl": run.isl,
            "osl": run.osl,
            "stream": run.stream,
            "cancel_fraction": run.cancel_fraction,
            "model": run.model,
            "frontend": frontend,
        },
        "clients": clients,
        "proxy": proxy_metrics(metrics_text),
        "taps": {name: _tap_totals(summary) for name, summary in taps.items()},
        "exit_status": exits,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    result["failures"] = evaluate(result)
    result["ok"] = not result["failures"]
    return result


async def _get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
        return await response.text()


async def _tap_listing(
    session: aiohttp.ClientSession, proxy_url: str
) -> list[dict[str, Any]] | None:
    """The proxy's tap list with the worker's counters (None before it has them)."""
    listing = await _get_json(session, proxy_url + "/shadow/taps")
    taps = listing.get("taps") if isinstance(listing, dict) else None
    if not taps or any("next_seq" not in t for t in taps):
        return None
    return taps


async def _taps_settled(
    session: aiohttp.ClientSession, proxy_url: str, sent: int
) -> list[dict[str, Any]] | None:
    """The tap listing once every tap has assigned ``sent`` records and has
    nothing left on its queue (published or dropped)."""
    taps = await _tap_listing(session, proxy_url)
    if taps is None:
        return None
    for tap in taps:
        done = tap["published"] + sum(tap.get("dropped", {}).values())
        if tap["next_seq"] < sent or done < tap["next_seq"] or tap.get("queue_depth", 0):
            return None
    return taps


async def _consumers_settled(
    summaries: dict[str, Path], next_seq: dict[str, int], children: Sequence[Child]
) -> None:
    """Wait until each consumer holds every record its tap sent, or has seen
    the tap's final heartbeat and waited out its grace (a loss then shows as
    gaps or tail loss in its summary)."""
    final_beat: dict[str, float] = {}

    async def settled() -> bool:
        now = time.monotonic()
        for name, path in summaries.items():
            summary = _read_summary(path) or {}
            if summary.get("records", 0) >= next_seq[name]:
                continue
            beats = [
                (p.get("last_heartbeat") or {}).get("next_seq")
                for p in summary.get("publishers", [])
            ]
            if next_seq[name] in beats:
                final_beat.setdefault(name, now)
                if now - final_beat[name] > CONSUMER_GRACE_S + 2 * CONSUMER_INTERVAL_S:
                    continue
            return False
        return True

    await _wait_until("the consumers catching up", settled, children, SETTLE_TIMEOUT_S, fatal=False)


def _tap_totals(summary: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "records",
        "prompt_tokens",
        "output_tokens",
        "outcomes",
        "tap_gaps",
        "transport_gaps",
        "tail_loss",
        "transport_tail_loss",
        "duplicates",
        "undecodable",
        "heartbeats",
    )
    totals = {k: summary.get(k) for k in keys}
    totals["publishers"] = len(summary.get("publishers", []))
    return totals


# --------------------------------------------------------------------------- metrics


def proxy_metrics(text: str) -> dict[str, Any]:
    """The parts of the proxy's ``/metrics`` the demo shows."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[tuple[str, dict[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        samples.extend((s.name, s.labels, s.value) for s in family.samples)

    def by(name: str, label: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for sample, labels, value in samples:
            if sample == name:
                key = labels.get(label, "")
                out[key] = out.get(key, 0) + int(value)
        return out

    def total(name: str) -> int:
        return int(sum(v for sample, _, v in samples if sample == name))

    requests: dict[str, int] = {}
    for sample, labels, value in samples:
        if sample == "shadow_proxy_requests_total":
            key = f"{labels.get('route')} {labels.get('status_class')}"
            requests[key] = requests.get(key, 0) + int(value)
    taps: dict[str, dict[str, Any]] = {}
    for name in ("queued", "published", "publish_errors"):
        for tap, value in by(f"shadow_tap_{name}_total", "tap").items():
            taps.setdefault(tap, {})[name] = value
    for sample, labels, value in samples:
        if sample in ("shadow_tap_dropped_total", "shadow_tap_skipped_total"):
            kind = "dropped" if "dropped" in sample else "skipped"
            entry = taps.setdefault(labels.get("tap", ""), {}).setdefault(kind, {})
            entry[labels.get("reason", "")] = int(value)
    return {
        "requests": dict(sorted(requests.items())),
        "client_disconnects": total("shadow_proxy_client_disconnects_total"),
        "upstream_errors": by("shadow_proxy_upstream_errors_total", "kind"),
        "handoff_dropped": by("shadow_handoff_dropped_total", "reason"),
        "worker_restarts": total("shadow_worker_restarts_total"),
        "not_mirrored": by("shadow_not_mirrored_total", "reason"),
        "prompt_token_checks": total("shadow_prompt_token_checks_total"),
        "prompt_token_mismatches": total("shadow_prompt_token_mismatches_total"),
        "taps": dict(sorted(taps.items())),
    }


# --------------------------------------------------------------------------- checks


def evaluate(result: dict[str, Any]) -> list[str]:
    """Why the run's accounting does not hold (empty: it holds)."""
    failures = []
    clients = result["clients"]
    sent = clients["requests"]
    if clients["errors"]:
        failures.append(f"{clients['errors']} client requests failed")
    expected_prompt = clients["frontend_prompt_tokens"]
    if clients["prompt_tokens_uncounted"]:
        failures.append(
            f"the frontend gave no prompt-token count for "
            f"{clients['prompt_tokens_uncounted']} requests"
        )
    for tap in reference_taps():
        name = tap["name"]
        totals = result["taps"].get(name) or {}
        if totals.get("records") != sent:
            failures.append(f"{name}: {totals.get('records')} records for {sent} requests")
        for key in ("tap_gaps", "transport_gaps", "tail_loss", "transport_tail_loss"):
            if totals.get(key):
                failures.append(f"{name}: {key} = {totals[key]}")
        if totals.get("duplicates"):
            failures.append(f"{name}: {totals['duplicates']} duplicate records")
        if totals.get("undecodable"):
            failures.append(f"{name}: undecodable messages {totals['undecodable']}")
        if (
            not clients["prompt_tokens_uncounted"]
            and totals.get("prompt_tokens") != expected_prompt
        ):
            failures.append(
                f"{name}: {totals.get('prompt_tokens')} prompt tokens, "
                f"the frontend reports {expected_prompt}"
            )
        if tap["capture"] == "request_response":
            outcomes = dict(totals.get("outcomes") or {})
            want = {"complete": clients["ok"], "cancelled": clients["cancelled"]}
            for outcome, count in want.items():
                if outcomes.pop(outcome, 0) != count:
                    failures.append(
                        f"{name}: {totals.get('outcomes', {}).get(outcome, 0)} {outcome} "
                        f"records, the clients saw {count}"
                    )
            for outcome, count in outcomes.items():
                if count:
                    failures.append(f"{name}: {count} {outcome} records")
        dropped = (result["proxy"]["taps"].get(name) or {}).get("dropped") or {}
        if any(dropped.values()):
            failures.append(f"{name}: the proxy dropped records {_counts(dropped)}")
    proxy = result["proxy"]
    if proxy["prompt_token_mismatches"]:
        failures.append(f"the proxy counted {proxy['prompt_token_mismatches']} prompt mismatches")
    if any(proxy["handoff_dropped"].values()):
        failures.append(f"the proxy dropped hand-offs {proxy['handoff_dropped']}")
    for name, status in result["exit_status"].items():
        if status != 0:
            failures.append(f"{name} exited with status {status} after SIGTERM")
    return failures


# --------------------------------------------------------------------------- the table


def _n(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def _counts(mapping: dict[str, int] | None) -> str:
    items = [(k, v) for k, v in (mapping or {}).items() if v]
    return ", ".join(f"{k} {v:,}" for k, v in items) if items else "none"


def _grid(rows: list[list[str]], right: Sequence[int] = (), indent: str = "  ") -> list[str]:
    """Aligned columns; the columns in ``right`` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def format_table(result: dict[str, Any]) -> str:
    """The run as plain text: load, clients, proxy metrics, taps, verdict."""
    load, clients, proxy = result["load"], result["clients"], result["proxy"]
    cancel = f", {load['cancel_fraction']:.0%} cancelled" if load["cancel_fraction"] else ""
    lines = [
        f"== {result['title']}: {load['requests']} requests, concurrency {load['concurrency']}, "
        f"ISL {load['isl']}, OSL {load['osl']}, "
        f"{'streaming' if load['stream'] else 'not streaming'}{cancel}",
        f"   frontend {load['frontend']}, model {load['model']}",
        "",
        "clients",
    ]
    asked = clients["prompt_tokens_asked_again"]
    prompt_note = f"  (+{asked} without usage, asked again)" if asked else ""
    lines += _grid(
        [
            [
                "sent / ok / cancelled / errors",
                f"{clients['requests']} / {clients['ok']} / {clients['cancelled']} / "
                f"{clients['errors']}",
            ],
            ["prompt tokens (usage of ok answers)", _n(clients["prompt_tokens"])],
            [
                "prompt tokens the frontend reports",
                _n(clients["frontend_prompt_tokens"]) + prompt_note,
            ],
            ["completion tokens", _n(clients["completion_tokens"])],
            ["requests/s (ok)", _n(clients["requests_per_s"])],
            [
                "TTFT p50 / p99 ms" if load["stream"] else "first byte p50 / p99 ms",
                f"{_n(clients['ttft_p50_ms'])} / {_n(clients['ttft_p99_ms'])}",
            ],
            [
                "end-to-end p50 / p99 ms",
                f"{_n(clients['e2e_p50_ms'])} / {_n(clients['e2e_p99_ms'])}",
            ],
        ]
    )
    lines += ["", "proxy /metrics"]
    rows = [
        ["requests (route status)", _counts(proxy["requests"])],
        ["client disconnects", _n(proxy["client_disconnects"])],
        ["upstream errors", _counts(proxy["upstream_errors"])],
        ["not mirrored", _counts(proxy["not_mirrored"])],
        [
            "prompt-token checks / mismatches",
            f"{_n(proxy['prompt_token_checks'])} / {_n(proxy['prompt_token_mismatches'])}",
        ],
        ["hand-off drops / worker restarts",
         f"{_counts(proxy['handoff_dropped'])} / {_n(proxy['worker_restarts'])}"],
    ]  # fmt: skip
    for name, tap in proxy["taps"].items():
        rows.append(
            [
                f"tap {name}",
                f"queued {_n(tap.get('queued'))}, published {_n(tap.get('published'))}, "
                f"dropped {_counts(tap.get('dropped'))}",
            ]
        )
    lines += _grid([[k, v] for k, v in rows])
    lines += ["", "taps (consumer totals)"]
    header = ["tap", "records", "prompt tok", "output tok", "tap_gaps", "transport_gaps",
              "tail loss", "outcomes"]  # fmt: skip
    grid = [header]
    for name, tap in result["taps"].items():
        tail = (tap.get("tail_loss") or 0) + (tap.get("transport_tail_loss") or 0)
        grid.append(
            [
                name,
                _n(tap.get("records")),
                _n(tap.get("prompt_tokens")),
                _n(tap.get("output_tokens")),
                _n(tap.get("tap_gaps")),
                _n(tap.get("transport_gaps")),
                _n(tail),
                _counts(tap.get("outcomes")) if tap.get("outcomes") else "-",
            ]
        )
    lines += _grid(grid, right=range(1, 7))
    timings = result["timings_s"]
    lines += [
        "",
        "timings  " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items()),
    ]
    if result["ok"]:
        lines.append(
            f"OK: each tap holds {load['requests']} records, no gap, no loss; prompt tokens "
            "equal the frontend's; every process stopped with status 0"
        )
    else:
        lines.append("FAILED:")
        lines += [f"  - {failure}" for failure in result["failures"]]
    return "\n".join(lines)


def _print_tails(children: Sequence[Child]) -> None:
    """The last lines of stderr of the children that exited on their own, or of
    every child if none did."""
    print(describe_failures(children, TAIL_LINES), file=sys.stderr)


# --------------------------------------------------------------------------- entry


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where there is none (None: decided later)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-proxy demo",
        description="Frontend, proxy with the reference taps, one consumer per tap and a "
        "load; prints what the clients, the proxy and the consumers saw. Without --stream, "
        "--no-stream or --cancel-fraction: the three reference runs.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--requests", type=_positive_int, default=200, help="requests per run")
    parser.add_argument(
        "--concurrency", type=_positive_int, default=16, help="requests in flight at once"
    )
    parser.add_argument("--isl", type=_positive_int, default=512, help="prompt tokens (about)")
    parser.add_argument("--osl", type=_positive_int, default=32, help="output tokens")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream the answers (a single run; default on)",
    )
    parser.add_argument(
        "--cancel-fraction",
        type=_fraction,
        default=None,
        metavar="F",
        help="fraction of requests the client cancels (a single run; default 0)",
    )
    parser.add_argument(
        "--runs",
        choices=("reference", "single"),
        default=None,
        help="reference: streaming, non-streaming, streaming with 25%% cancelled "
        "(default unless --stream, --no-stream or --cancel-fraction is given)",
    )
    parser.add_argument(
        "--frontend",
        metavar="URL",
        help="a running OpenAI-compatible frontend (default: start the built-in one)",
    )
    parser.add_argument("--model", default="deepseek", help="the model name requests use")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=Path(".models/deepseek"),
        metavar="DIR",
        help="the model's local tokenizer directory (the proxy's, and the built-in frontend's)",
    )
    parser.add_argument(
        "--ttft-ms", type=float, default=20.0, help="the built-in frontend's time to first token"
    )
    parser.add_argument(
        "--itl-ms", type=float, default=5.0, help="the built-in frontend's time per output token"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        msg = f"must be between 0 and 1 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def plan(args: argparse.Namespace) -> list[RunOptions]:
    single = args.stream is not None or args.cancel_fraction is not None
    if args.runs == "reference" or (args.runs is None and not single):
        return reference_runs(args)
    stream = True if args.stream is None else args.stream
    cancel = args.cancel_fraction or 0.0
    title = "streaming" if stream else "non-streaming"
    if cancel:
        title += f", {cancel:.0%} cancelled"
    return [RunOptions(title, stream=stream, cancel_fraction=cancel, **_shape(args))]


@contextlib.contextmanager
def _log_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shadow-proxy-demo-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_all(args: argparse.Namespace, runs: list[RunOptions], out: IO[str]) -> list[dict]:
    results = []
    with _log_dir() as log_dir:
        async with contextlib.AsyncExitStack() as stack:
            if args.frontend:
                frontend = args.frontend.rstrip("/")
                await check_frontend(frontend, args.model)
            else:
                print(
                    f"starting the built-in frontend (ttft {args.ttft_ms:g} ms, "
                    f"itl {args.itl_ms:g} ms) ...",
                    file=out,
                    flush=True,
                )
                frontend = await stack.enter_async_context(
                    builtin_frontend(
                        {args.model: args.tokenizer}, args.ttft_ms, args.itl_ms, log_dir
                    )
                )
            for number, run in enumerate(runs, 1):
                run_dir = log_dir / f"run-{number}"
                run_dir.mkdir()
                print(f"\nrun {number}/{len(runs)}: {run.title} ...", file=out, flush=True)
                result = await run_once(run, frontend, run_dir)
                results.append(result)
                print(format_table(result), file=out, flush=True)
    return results


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the demo as Ctrl-C does: every child is stopped first."""
    raise KeyboardInterrupt


def run_demo(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Entry point of ``shadow-proxy demo``: 0 if every run's accounting holds."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    args.tokenizer = args.tokenizer.resolve()
    if not (args.tokenizer / "tokenizer.json").exists():
        print(
            f"demo: no tokenizer.json in {args.tokenizer} (build the local model directories "
            "with `make models`, or pass --tokenizer DIR)",
            file=sys.stderr,
        )
        return 2
    runs = plan(args)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = asyncio.run(run_all(args, runs, out))
    except (DemoError, ChildExited, WaitTimeout) as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    ok = all(r["ok"] for r in results)
    elapsed = time.monotonic() - started
    if len(results) > 1:
        passed = sum(r["ok"] for r in results)
        print(f"\n{passed}/{len(results)} runs OK in {elapsed:.1f} s", file=out)
    if args.json:
        args.json.write_text(
            json.dumps({"ok": ok, "elapsed_s": round(elapsed, 2), "runs": results}, indent=2)
            + "\n",
            encoding="utf-8",
        )
    return 0 if ok else 1
