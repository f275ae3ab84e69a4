"""The command line in this process: configuration errors, and each subcommand reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shadow_proxy import cli
from shadow_proxy.config import ConfigError
from shadow_proxy.records import envelope, files, wire

VALID = "schema_version: 1\nupstream: {url: 'http://127.0.0.1:9'}\n"


class TestLoadConfig:
    """``--config`` wins; else ``SHADOW_PROXY_CONFIG``; else a plain error."""

    def test_no_configuration(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("SHADOW_PROXY_CONFIG", raising=False)
        with pytest.raises(ConfigError, match="pass --config FILE or set SHADOW_PROXY_CONFIG"):
            cli.load_config(None)

    def test_from_the_environment(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "env.yaml"
        path.write_text(VALID)
        monkeypatch.setenv("SHADOW_PROXY_CONFIG", str(path))
        assert cli.load_config(None).path == str(path)

    def test_the_option_wins(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        given = tmp_path / "given.yaml"
        given.write_text(VALID)
        monkeypatch.setenv("SHADOW_PROXY_CONFIG", str(tmp_path / "other.yaml"))
        assert cli.load_config(str(given)).path == str(given)


class TestServe:
    """An invalid file exits with status 2 and one line naming it, before serving."""

    def test_invalid_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = tmp_path / "bad.yaml"
        path.write_text(VALID + "listen: {prot: 1}\n")
        assert cli.main(["serve", "--config", str(path)]) == cli.EXIT_CONFIG == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [
            f"shadow-proxy: {path}:3: 'listen.prot' is not a known key; "
            "expected one of body_timeout_s, host, max_connections, port"
        ]

    def test_unknown_arguments(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as caught:
            cli.main(["serve", "--config", "x.yaml", "--nope"])
        assert caught.value.code == 2
        assert "unrecognized arguments: --nope" in capsys.readouterr().err


class TestSubcommands:
    """Each subcommand hands the rest of the line to its own parser."""

    def test_consumer_reads_a_record_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "records.mpk"
        writer = files.RecordFile(path, max_bytes=2**20, keep=1)
        for seq in range(3):
            record = envelope.build_envelope(
                tap="a",
                seq=seq,
                request_id=f"r{seq}",
                origin="chat",
                filters=[],
                arrival_unix_ns=1,
                sample_rate=1.0,
                request={"token_ids": [1, 2]},
                response=None,
            )
            writer.write(wire.Message("t", 5, seq, 0, wire.encode_envelope(record)))
        writer.close()
        assert cli.main(["--log-level", "error", "consumer", str(path)]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["records"], summary["prompt_tokens"], summary["tap_gaps"]) == (3, 6, 0)

    def test_mock_frontend_with_a_missing_model(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["mock-frontend", "--model", f"m={tmp_path}"]) == 2
        assert "no tokenizer.json" in capsys.readouterr().err

    def test_demo_with_a_missing_tokenizer(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["demo", "--tokenizer", str(tmp_path)]) == 2
        assert f"no tokenizer.json in {tmp_path}" in capsys.readouterr().err

    def test_bench_from_the_checkout(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as caught:
            cli.main(["bench", "--help"])
        assert caught.value.code == 0
        assert "shadow-proxy bench" in capsys.readouterr().out


def test_help_is_complete():
    result = subprocess.run(
        [sys.executable, "-m", "shadow_proxy.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "A reverse-proxy sidecar for OpenAI-compatible LLM frontends: it forwards" in text
    assert "publishes each request, as the engine sees it, on taps." in text
    for command in ("serve", "mock-frontend", "consumer", "bench", "demo"):
        assert command in text
    # No sentence cut off: every paragraph of the description and epilog ends with a period.
    description = result.stdout.split("\n\n")[1]
    assert description.rstrip().endswith(".")
    assert "exits with status 2" in text
