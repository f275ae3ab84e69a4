"""``--profile``: one unmeasured run of the ``taps`` case with py-spy attached to the
serving process and the tap worker; their top functions, self and inclusive."""

from __future__ import annotations

import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.cases import (
    Setup,
    evolved,
)
from bench.services import Frontend
from shadow_proxy.devtools.loadgen import LoadSpec, run_load


async def profile_case(frontend: Frontend, scratch: Path, spec: LoadSpec, isolate: bool):
    """One unmeasured run of ``taps`` with py-spy on the serving process and the worker."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return {"error": "py-spy not installed (pip install py-spy)"}
    setup = await Setup.start("taps", frontend, scratch, isolate)
    spies = {}
    try:
        await run_load(evolved(spec, url=setup.url, requests=100))
        for role in ("proxy", "worker"):
            out = scratch / f"pyspy-{role}.txt"
            spies[role] = (
                out,
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--nonblocking",
                        "--rate",
                        "200",
                        "--format",
                        "raw",
                        "--output",
                        str(out),
                        "--pid",
                        str(setup.pids[role]),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
            )
        await asyncio.sleep(1.0)
        await run_load(evolved(spec, url=setup.url))
        for _, spy in spies.values():
            spy.send_signal(signal.SIGINT)
        for _, spy in spies.values():
            spy.wait(30)
        setup.finish_consumers()
    finally:
        setup.stop()
    return {role: top_functions(out) for role, (out, _) in spies.items()}


def top_functions(path: Path, n: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw output."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        return {"error": str(e)}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";")]
        frames = [f for f in frames if f]
        if not frames:
            continue
        n_samples = int(count)
        total += n_samples
        self_counts[frames[-1]] += n_samples
        for frame in set(frames):
            incl_counts[frame] += n_samples

    def share(c: collections.Counter) -> list[list[Any]]:
        return [[f, round(100 * v / total, 1)] for f, v in c.most_common(n)] if total else []

    return {"samples": total, "self": share(self_counts), "inclusive": share(incl_counts)}


def _short(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``; process/thread lines dropped."""
    match = re.match(r"^(.*?) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return ""
    func, file = match.groups()
    parts = Path(file).parts
    if "site-packages" in parts:
        file = "/".join(parts[parts.index("site-packages") + 1 :])
    elif "shadow_proxy" in parts:
        file = "/".join(parts[parts.index("shadow_proxy") :])
    else:
        file = Path(file).name
    return f"{func} ({file})"
