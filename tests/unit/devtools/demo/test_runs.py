"""What the demo runs: every part, a part, or the one run asked for."""

from __future__ import annotations

import pytest

from shadow_proxy.devtools.demo.cli import build_parser
from shadow_proxy.devtools.demo.runs import ReplayPlan, plan


def _plan(*argv: str) -> list:
    return plan(build_parser().parse_args(list(argv)))


class TestPlan:
    """Without load options the demo runs the four reference runs, the multi-turn run
    and the replay run; --runs picks a part; a load option means a single run."""

    def test_default_is_everything(self) -> None:
        runs = _plan()
        loads = runs[:4]
        assert [(r.api, r.stream, r.cancel_fraction) for r in loads] == [
            ("chat", True, 0.0),
            ("chat", False, 0.0),
            ("chat", True, 0.25),
            ("responses", True, 0.25),
        ]
        assert all((r.kind, r.requests, r.isl, r.osl) == ("load", 200, 512, 32) for r in loads)
        multi = runs[4]
        assert (multi.kind, multi.conversations, multi.turns) == ("multi-turn", 20, 8)
        assert (multi.requests, multi.concurrency, multi.stream) == (160, 20, True)
        replay = runs[5]
        assert isinstance(replay, ReplayPlan) and len(runs) == 6
        assert (replay.source_run, replay.extra_ttft_ms, replay.extra_itl_ms) == (1, 50.0, 5.0)
        assert (replay.diverge_fraction, replay.diverge_at) == (0.2, 4)

    def test_reference_only(self) -> None:
        runs = _plan("--runs", "reference")
        assert [r.title for r in runs] == [
            "streaming",
            "non-streaming",
            "streaming, 25% cancelled",
            "responses, streaming, 25% cancelled",
        ]

    def test_multi_turn_only(self) -> None:
        (run,) = _plan("--runs", "multi-turn", "--conversations", "3", "--turns", "2")
        assert (run.kind, run.requests, run.concurrency) == ("multi-turn", 6, 3)

    def test_replay_takes_the_run_it_replays(self) -> None:
        first, replay = _plan("--runs", "replay", "--candidate-diverge-at", "7")
        assert (first.title, first.api, first.cancel_fraction) == ("streaming", "chat", 0.0)
        assert isinstance(replay, ReplayPlan) and replay.source_run == 1
        assert replay.diverge_at == 7

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["--no-stream", "--requests", "5"], ("chat", False, 0.0, 5, "non-streaming")),
            (["--cancel-fraction", "0.5"], ("chat", True, 0.5, 200, "streaming, 50% cancelled")),
            (["--api", "responses"], ("responses", True, 0.0, 200, "responses, streaming")),
            (["--runs", "single"], ("chat", True, 0.0, 200, "streaming")),
        ],
    )
    def test_a_load_option_means_a_single_run(self, argv: list[str], expected: tuple) -> None:
        (run,) = _plan(*argv)
        assert (run.api, run.stream, run.cancel_fraction, run.requests, run.title) == expected
