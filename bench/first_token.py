"""First-token time in front of Dynamo 1.6.1, direct and through the proxy, on
kept-alive and fresh client connections, with the proxy's quick ACK on and off.

Dynamo's HTTP listener writes without TCP_NODELAY: on a kept-alive connection
its first body bytes wait for the delayed acknowledgement of the response
headers (docs/running.md, "Pooled connections cost no first token"). The proxy keeps
its connections to the frontend alive, so without a quick ACK a client that
connects afresh for each request pays the stall through the proxy and not
directly. Sequential requests (one in flight), so what is measured is the
stall, not queueing: Dynamo with the mocker at speedup 2, prefix caching off,
short prompts, 8 output tokens.

    .venv/bin/python -m bench.first_token [--requests 40]

Writes ``bench/results/<time>-first-token.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.services import MODEL_DIR, MODEL_NAME, RESULTS, start_proxy
from bench.tables import machine
from shadow_proxy.devtools.dynamo import start_dynamo
from shadow_proxy.devtools.loadgen import first_bytes_ms

SPEEDUP = 2.0
GAP_S = 0.01


async def first_token_ms(url: str, requests: int, *, fresh: bool) -> float:
    """Median time to the first body bytes of ``requests`` sequential streams."""
    bodies = (
        {
            "model": MODEL_NAME,
            "max_tokens": 8,
            "stream": True,
            "messages": [{"role": "user", "content": "x " * (10 + 20 * k)}],
        }
        for k in range(requests)
    )
    url += "/v1/chat/completions"
    return statistics.median(await first_bytes_ms(url, bodies, fresh=fresh, gap_s=GAP_S))


async def measure(requests: int, scratch: Path) -> list[dict[str, Any]]:
    dynamo = await start_dynamo(
        MODEL_DIR,
        MODEL_NAME,
        scratch / "dynamo",
        SPEEDUP,
        extra_mocker_args=("--no-enable-prefix-caching",),
    )
    rows = []
    try:
        targets: list[tuple[str, str, Any]] = [("Dynamo direct", dynamo.base_url, None)]
        for quick_ack in (True, False):
            child, url, _, _ = await start_proxy(
                dynamo.base_url, scratch, False, None, quick_ack=quick_ack
            )
            targets.append(
                (f"through the proxy, quick_ack {'on' if quick_ack else 'off'}", url, child)
            )
        for name, url, _ in targets:
            row = {"path": name}
            for fresh in (False, True):
                label = "fresh" if fresh else "kept_alive"
                row[label] = round(await first_token_ms(url, requests, fresh=fresh), 1)
            print(
                f"{name}: kept-alive {row['kept_alive']} ms, fresh {row['fresh']} ms",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
        for _, _, child in targets:
            if child is not None:
                child.terminate(10)
    finally:
        await dynamo.aclose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.first_token", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="sequential requests per case")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shadow-first-token-") as tmp:
        rows = asyncio.run(measure(args.requests, Path(tmp)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = ".venv/bin/python -m bench.first_token " + " ".join(argv or sys.argv[1:])
    info = machine()
    lines = [
        f"## shadow-proxy bench: first token (stamp {stamp})",
        "",
        f"Command: `{command.strip()}`  ",
        f"Commit: {info['commit']}  ",
        f"Machine: {info['cpu_model']}, {info['cores']} cores, load average at start "
        f"{info['loadavg_at_start']}",
        "",
        f"Dynamo 1.6.1 frontend + mocker (speedup {SPEEDUP}, prefix caching off); "
        f"{args.requests} sequential streaming chat requests per cell, 8 output tokens; "
        "median milliseconds from sending to the first body bytes.",
        "",
        "| path | client keeps its connection | client connects afresh |",
        "|---|---:|---:|",
        *(f"| {r['path']} | {r['kept_alive']} | {r['fresh']} |" for r in rows),
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stamp}-first-token.md").write_text("\n".join(lines), encoding="utf-8")
    (RESULTS / f"{stamp}-first-token.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=1), encoding="utf-8"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
