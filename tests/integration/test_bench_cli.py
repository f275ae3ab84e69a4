"""The benchmarks' command lines (issue 17 item 13): ``--help`` helps and runs
nothing; a bench run never rewrites a tracked file."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_bench_preprocess_help_runs_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_preprocess.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: bench_preprocess.py")
    assert "--models" in result.stdout
    assert list(tmp_path.iterdir()) == []  # no "--help/" directory, no model dirs


def test_latest_results_are_not_tracked():
    """``make bench`` writes bench/results/latest.md: ignored, never committed."""
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "bench/results/latest.md"], timeout=30
    )
    assert ignored.returncode == 0, "bench/results/latest.md is not in .gitignore"
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "bench/results/latest.md"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tracked.stdout == ""
