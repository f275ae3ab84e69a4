"""What the demo runs: the reference runs, or the one run asked for."""

from __future__ import annotations

from shadow_proxy.devtools.demo.cli import build_parser
from shadow_proxy.devtools.demo.runs import plan


class TestPlan:
    """Without load options the demo runs the three reference runs; with one, a single run."""

    def test_default_is_the_reference_runs(self):
        runs = plan(build_parser().parse_args([]))
        assert [(r.stream, r.cancel_fraction) for r in runs] == [
            (True, 0.0),
            (False, 0.0),
            (True, 0.25),
        ]
        assert all((r.requests, r.isl, r.osl) == (200, 512, 32) for r in runs)

    def test_a_load_option_means_a_single_run(self):
        runs = plan(build_parser().parse_args(["--no-stream", "--requests", "5"]))
        assert [(r.stream, r.cancel_fraction, r.requests) for r in runs] == [(False, 0.0, 5)]
        runs = plan(build_parser().parse_args(["--cancel-fraction", "0.5"]))
        assert [(r.stream, r.cancel_fraction) for r in runs] == [(True, 0.5)]
