"""``shadow-proxy mock-frontend``: the arguments, and exit status 2 on a bad model."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_proxy.devtools.frontend.cli import build_parser, run_mock_frontend


class TestCommandLine:
    """The parser reads models and pacing; a model that cannot load exits 2."""

    def test_parser(self) -> None:
        args = build_parser().parse_args(
            ["--model", "a=/x", "--model", "/y/b", "--itl-ms", "2", "--ttft-ms", "5"]
        )
        assert args.model == [("a", Path("/x")), ("b", Path("/y/b"))]
        assert (args.itl_ms, args.ttft_ms, args.default_max_tokens) == (2.0, 5.0, 16)

    def test_missing_tokenizer_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert run_mock_frontend(["--model", f"m={tmp_path}"]) == 2
        assert "no tokenizer.json" in capsys.readouterr().err
