"""The demo's table: one run's result as plain text.

``format_table`` runs once per run through the proxy, after its checks: the
load, what the clients saw, what the proxy's ``/metrics`` say, each
consumer's totals, any further section of the run (the multi-turn run's reuse
summary), the timings and the verdict (``OK: ...`` or each failure on its own
line). ``grid`` and ``number`` also serve the other runs' tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TRANSPORT_NAMES = {"zmq": "ZeroMQ", "nats": "NATS JetStream"}


def number(value: Any) -> str:
    """A value as the table shows it: separators, one decimal, ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def counts(mapping: dict[str, int] | None) -> str:
    """``reason count`` pairs, the zeros left out; ``none`` when all are zero."""
    items = [(k, v) for k, v in (mapping or {}).items() if v]
    return ", ".join(f"{k} {v:,}" for k, v in items) if items else "none"


def grid(rows: list[list[str]], right: Sequence[int] = (), indent: str = "  ") -> list[str]:
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


def format_table(result: dict[str, Any], sections: Sequence[str] = ()) -> str:
    """The run as plain text: load, clients, proxy metrics, taps, then ``sections``
    (the multi-turn run's reuse summary), timings and the verdict."""
    load, clients, proxy = result["load"], result["clients"], result["proxy"]
    cancel = f", {load['cancel_fraction']:.0%} cancelled" if load["cancel_fraction"] else ""
    api = {"chat": "chat", "completions": "completions", "responses": "Responses API"}.get(
        load.get("api", "chat"), load.get("api")
    )
    if result.get("kind") == "multi-turn":
        shape = (
            f"{load['requests']} requests ({load['conversations']} conversations at once, "
            f"{load['turns']} turns each, every turn resending its history), OSL {load['osl']}"
        )
    else:
        shape = (
            f"{load['requests']} requests, concurrency {load['concurrency']}, "
            f"ISL {load['isl']}, OSL {load['osl']}"
        )
    lines = [
        f"== {result['title']}: {shape}, {api}, "
        f"{'streaming' if load['stream'] else 'not streaming'}{cancel}",
        f"   frontend {load['frontend']}, model {load['model']}, "
        f"taps over {TRANSPORT_NAMES.get(load.get('transport', 'zmq'), load.get('transport'))}",
        "",
        "clients",
    ]
    asked = clients["prompt_tokens_asked_again"]
    prompt_note = f"  (+{asked} without usage, asked again)" if asked else ""
    lines += grid(
        [
            [
                "sent / ok / cancelled / errors",
                f"{clients['requests']} / {clients['ok']} / {clients['cancelled']} / "
                f"{clients['errors']}",
            ],
            ["prompt tokens (usage of ok answers)", number(clients["prompt_tokens"])],
            [
                "prompt tokens the frontend reports",
                number(clients["frontend_prompt_tokens"]) + prompt_note,
            ],
            ["completion tokens", number(clients["completion_tokens"])],
            ["requests/s (ok)", number(clients["requests_per_s"])],
            [
                "TTFT p50 / p99 ms" if load["stream"] else "first byte p50 / p99 ms",
                f"{number(clients['ttft_p50_ms'])} / {number(clients['ttft_p99_ms'])}",
            ],
            [
                "end-to-end p50 / p99 ms",
                f"{number(clients['e2e_p50_ms'])} / {number(clients['e2e_p99_ms'])}",
            ],
        ]
    )
    lines += ["", "proxy /metrics"]
    rows = [
        ["requests (route status)", counts(proxy["requests"])],
        ["client disconnects", number(proxy["client_disconnects"])],
        ["upstream errors", counts(proxy["upstream_errors"])],
        ["not mirrored", counts(proxy["not_mirrored"])],
        [
            "prompt-token checks / mismatches",
            f"{number(proxy['prompt_token_checks'])} / {number(proxy['prompt_token_mismatches'])}",
        ],
        [
            "hand-off drops / worker restarts",
            f"{counts(proxy['handoff_dropped'])} / {number(proxy['worker_restarts'])}",
        ],
    ]
    for name, tap in proxy["taps"].items():
        rows.append(
            [
                f"tap {name}",
                f"queued {number(tap.get('queued'))}, published {number(tap.get('published'))}, "
                f"dropped {counts(tap.get('dropped'))}",
            ]
        )
    lines += grid([[k, v] for k, v in rows])
    lines += ["", "taps (consumer totals)"]
    header = [
        "tap",
        "records",
        "prompt tok",
        "output tok",
        "tap_gaps",
        "transport_gaps",
        "tail loss",
        "outcomes",
    ]
    tap_rows = [header]
    for name, tap in result["taps"].items():
        tail = (tap.get("tail_loss") or 0) + (tap.get("transport_tail_loss") or 0)
        tap_rows.append(
            [
                name,
                number(tap.get("records")),
                number(tap.get("prompt_tokens")),
                number(tap.get("output_tokens")),
                number(tap.get("tap_gaps")),
                number(tap.get("transport_gaps")),
                number(tail),
                counts(tap.get("outcomes")) if tap.get("outcomes") else "-",
            ]
        )
    lines += grid(tap_rows, right=range(1, 7))
    lines += sections
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
