"""What the benchmark reads of its processes in /proc: CPU seconds, RSS, children,
and CPU pinning."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (children excluded)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_tree_seconds(pid: int) -> float:
    """utime + stime of a process and of its running children (the tap worker's
    main and its shards)."""
    return cpu_seconds(pid) + sum(cpu_seconds(child) for child in children(pid))


def rss_tree_mb(pid: int) -> float:
    return rss_mb(pid) + sum(rss_mb(child) for child in children(pid))


def rss_mb(pid: int) -> float:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * PAGE_KB / 1024


def pin(pid: int, cpus: str) -> None:
    """Pin every thread of ``pid`` (new threads inherit from their creator)."""
    mask = {int(c) for c in cpus.split(",")}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), mask)


def children(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out
