"""One way to start a child: its target named by import path, its arguments on the
lifeline, its exit status back; the parent's end of the lifeline closed once the
child is reaped. (A killed parent ends its child: tests/integration/test_lifeline.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadow_proxy import lifeline

pytestmark = pytest.mark.timeout(60)


def report(path: str, *values: object) -> int:
    """A child's target: writes what it was given, exits 7."""
    Path(path).write_text(json.dumps(values))
    return 7


class TestSpawn:
    def test_target_arguments_and_status(self, tmp_path) -> None:
        out = tmp_path / "out"
        child = lifeline.spawn(("tests.unit.test_lifeline", "report"), (str(out), 1, "two"))
        assert lifeline.reap(child, 30) == 7
        assert json.loads(out.read_text()) == [1, "two"]
        assert child.stdin is not None and child.stdin.closed

    def test_reap_of_a_running_child_waits_and_keeps_the_lifeline(self) -> None:
        child = lifeline.spawn(("time", "sleep"), (30,))
        try:
            assert lifeline.reap(child, 0.01) is None
            assert child.stdin is not None and not child.stdin.closed
        finally:
            child.kill()
            assert lifeline.reap(child, 10) is not None
