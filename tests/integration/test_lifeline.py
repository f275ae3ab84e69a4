"""A child never outlives its parent (lifeline.py).

A small parent process spawns a child with ``lifeline.spawn`` as the supervisor
spawns the tap worker and the worker's main its shards; the test SIGKILLs the
parent and watches the child: an obedient child ends at once (the parent-death
signal), one that ignores SIGTERM ends by itself after ``EXIT_AFTER_S``.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shadow_proxy.lifeline import EXIT_AFTER_S
from tests.integration.harness import alive

pytestmark = pytest.mark.timeout(60)

PR_GET_PDEATHSIG = 2


def obedient(report: str) -> int:
    """A worker main: reports its parent-death signal, then sleeps (SIGTERM ends it)."""
    value = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    Path(report).write_text(str(value.value))
    time.sleep(600)
    return 0


def stubborn(report: str) -> int:
    """A worker main stuck in a long job: SIGTERM ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(report).write_text("ready")
    time.sleep(600)
    return 0


PARENT = textwrap.dedent("""\
    import sys, time
    from shadow_proxy import lifeline
    child = lifeline.spawn(("tests.integration.test_lifeline", sys.argv[1]), (sys.argv[2],))
    print(child.pid, flush=True)
    time.sleep(600)
""")


def start(tmp_path: Path, main: str) -> tuple[subprocess.Popen, int, Path]:
    report = tmp_path / "report"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, main, str(report)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not report.exists():
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    return parent, child, report


def killed_parent_then_gone_after(parent: subprocess.Popen, child: int, bound: float) -> float:
    parent.kill()
    parent.wait()
    parent.stdout.close()
    started = time.monotonic()
    while alive(child):
        assert time.monotonic() - started < bound, f"child alive {bound}s after its parent died"
        time.sleep(0.05)
    return time.monotonic() - started


def test_parent_death_signal_is_sigterm_and_ends_the_child_at_once(tmp_path):
    parent, child, report = start(tmp_path, "obedient")
    assert report.read_text() == str(int(signal.SIGTERM))
    assert killed_parent_then_gone_after(parent, child, 2.0) < 2.0


def test_a_child_that_ignores_sigterm_exits_by_itself(tmp_path):
    parent, child, _ = start(tmp_path, "stubborn")
    gone = killed_parent_then_gone_after(parent, child, EXIT_AFTER_S + 2.0)
    assert gone >= EXIT_AFTER_S - 0.5  # not the signal: the watcher's exit
