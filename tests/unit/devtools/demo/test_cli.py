"""``shadow-proxy demo`` in this process: option checks and early failures."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from shadow_proxy.devtools.demo.cli import build_parser, run_demo
from shadow_proxy.devtools.processes import reserve_port


class TestOptions:
    """Counts must be positive and fractions within 0..1."""

    @pytest.mark.parametrize(
        "argv",
        [
            ["--requests", "0"],
            ["--concurrency", "-1"],
            ["--cancel-fraction", "1.5"],
            ["--runs", "some"],
            ["--transport", "kafka"],
            ["--api", "embeddings"],
            ["--turns", "0"],
            ["--conversations", "0"],
            ["--candidate-diverge-fraction", "2"],
            ["--candidate-extra-ttft-ms", "-1"],
            ["--candidate-diverge-at", "-1"],
        ],
    )
    def test_rejected(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as caught:
            build_parser().parse_args(argv)
        assert caught.value.code == 2
        assert "error:" in capsys.readouterr().err

    def test_defaults(self) -> None:
        args = build_parser().parse_args([])
        assert (args.requests, args.concurrency, args.isl, args.osl) == (200, 16, 512, 32)
        assert (args.ttft_ms, args.itl_ms, args.model) == (20.0, 5.0, "deepseek")
        assert (args.transport, args.runs, args.out) == ("zmq", None, None)
        assert (args.conversations, args.turns) == (20, 8)
        assert (args.candidate_extra_ttft_ms, args.candidate_extra_itl_ms) == (50.0, 5.0)
        assert (args.candidate_diverge_fraction, args.candidate_diverge_at) == (0.2, 4)


class TestEarlyFailures:
    """Nothing starts when the tokenizer or the given frontend is missing."""

    def test_missing_tokenizer_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert run_demo(["--tokenizer", str(tmp_path)]) == 2
        assert "make models" in capsys.readouterr().err

    def test_a_frontend_that_does_not_answer(
        self, model_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        url = f"http://127.0.0.1:{reserve_port()}"
        out = io.StringIO()
        argv = ["--frontend", url, "--tokenizer", str(model_dirs["deepseek"]), "--requests", "1"]
        assert run_demo(argv, out=out) == 1
        assert f"demo failed: the frontend at {url} does not answer GET /v1/models" in (
            capsys.readouterr().err
        )
        assert "run 1/" not in out.getvalue()
