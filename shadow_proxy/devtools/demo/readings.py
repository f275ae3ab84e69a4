"""What a demo run reads back: the proxy's metrics, each consumer's totals, and
the prompt tokens the frontend reports.

``proxy_metrics`` and ``tap_totals`` run once per run, after the load, on the
proxy's ``/metrics`` text and each consumer's summary file.
``frontend_prompt_tokens`` runs once per run after the load: it counts the
frontend's own ``usage.prompt_tokens`` for every request sent, asking the
frontend again (straight, not through the proxy) for the requests whose answer
carried none, so that the taps' prompt tokens can be checked for all of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from shadow_proxy.devtools.loadgen import PATHS, LoadSpec, Report, make_body, usage_of


def read_summary(path: Path) -> dict[str, Any] | None:
    """A consumer's summary file, or None while it is missing or half written."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


#: Builds the body that asks the frontend again for request ``index``'s prompt
#: tokens: ``(path, body)``, or None when the request cannot be sent again.
Probe = Callable[[int], tuple[str, bytes] | None]


def load_probe(spec: LoadSpec) -> Probe:
    """The probe of a ``loadgen`` load: the same prompt, unary, for one token."""
    probe = attrs.evolve(spec, stream=False, output_tokens=1, cancel_fraction=0.0)
    path = PATHS[spec.api]
    return lambda index: (path, make_body(probe, index))


async def frontend_prompt_tokens(
    frontend: str, report: Report, probe: Probe, headers: Mapping[str, str] | None = None
) -> tuple[int, int, int]:
    """What the frontend reports as prompt tokens, over every request sent.

    Answers that carried ``usage`` count as they are. A request without it (the
    client cancelled it, or it failed) is sent again with the same prompt
    (``probe``), straight to the frontend (not through the proxy), unary, for
    one token, and its ``usage`` prompt tokens count (``input_tokens`` for the
    Responses API). Returns (total, requests asked again, requests still
    without a count).
    """
    total = sum(r.usage.get("prompt_tokens", 0) for r in report.results if r.usage)
    missing = [r.index for r in report.results if not r.usage]
    if not missing:
        return total, 0, 0
    limit = asyncio.Semaphore(max(1, min(8, report.spec.concurrency)))
    uncounted = 0

    async def ask(session: aiohttp.ClientSession, index: int) -> int | None:
        request = probe(index)
        if request is None:
            return None
        path, body = request
        async with limit:
            try:
                async with session.post(
                    frontend + path,
                    data=body,
                    headers={"Content-Type": "application/json", **(headers or {})},
                ) as response:
                    answer = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None
        usage = usage_of(answer)
        count = usage.get("prompt_tokens") if usage else None
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


def tap_totals(summary: dict[str, Any]) -> dict[str, Any]:
    """The totals of a consumer's summary that the demo shows and checks."""
    keys = (
        "records",
        "prompt_tokens",
        "output_tokens",
        "outcomes",
        "errors",
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
    totals["source"] = summary.get("source")
    return totals
