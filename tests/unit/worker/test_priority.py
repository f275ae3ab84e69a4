"""The worker's priority: the idle class on every thread, or nice 19 where there is none.

Each case runs in a child process: the idle class cannot be left without privileges,
and the test process must keep its own priority.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here")

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from shadow_proxy.worker import priority

    if sys.argv[1] == "no-idle":
        del os.SCHED_IDLE  # as on a system without the idle class
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    result = priority.lower_priority()
    after = threading.Thread(target=stop.wait)
    after.start()
    tids = {"main": threading.get_native_id(), "before": before.native_id,
            "after": after.native_id}
    report = {
        "policy": result.policy,
        "threads": result.threads,
        "reason": result.fallback_reason,
        "schedulers": {k: os.sched_getscheduler(t) for k, t in tids.items()},
        "nice": {k: os.getpriority(os.PRIO_PROCESS, t) for k, t in tids.items()},
    }
    stop.set()
    print(json.dumps(report))
    """
)


def run_child(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@linux_only
class TestIdleClass:
    """Every thread, the ones started before and after the call, is in SCHED_IDLE."""

    def test_all_threads_idle(self):
        report = run_child("idle")
        assert report["policy"] == "idle"
        assert report["reason"] is None
        assert report["threads"] >= 2
        assert report["schedulers"] == dict.fromkeys(("main", "before", "after"), os.SCHED_IDLE)

    def test_test_process_unchanged(self):
        run_child("idle")
        assert os.sched_getscheduler(0) != os.SCHED_IDLE


@linux_only
class TestFallback:
    """Without the idle class: nice 19 on every thread, and the reason is said."""

    def test_nice_19_everywhere(self):
        report = run_child("no-idle")
        assert report["policy"] == "nice"
        assert "SCHED_IDLE" in report["reason"]
        assert report["nice"] == dict.fromkeys(("main", "before", "after"), 19)
        assert os.SCHED_IDLE not in report["schedulers"].values()
