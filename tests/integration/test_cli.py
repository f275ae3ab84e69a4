"""``shadow-proxy serve`` as a process: an invalid configuration exits 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
    reserve_endpoint,
    reserve_port,
    wait_http_ok,
)
from tests.support import ROOT

SHADOW_PROXY = Path(sys.executable).parent / "shadow-proxy"


BASE = """\
schema_version: 1
upstream:
  url: http://127.0.0.1:9
"""


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    full_env = {k: v for k, v in os.environ.items() if k != "SHADOW_PROXY_CONFIG"}
    full_env.update(env or {})
    return subprocess.run(
        [str(SHADOW_PROXY), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
        check=False,
    )


class TestCommandLine:
    """``shadow-proxy serve``: an invalid file exits 2 with one line on stderr."""

    def test_invalid_file_exits_2_with_one_line(self, tmp_path):
        path = tmp_path / "bad.yaml"
        path.write_text(BASE + "taps:\n  - {name: a, capture: request, capacity: 0}\n")
        result = run_cli("serve", "--config", str(path))
        assert result.returncode == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert str(path) in lines[0]
        assert ":5:" in lines[0]
        assert "'taps[a].capacity'" in lines[0]
        assert "(got 0)" in lines[0]
        assert result.stdout == ""

    def test_environment_variable_names_the_file(self, tmp_path):
        path = tmp_path / "from-env.yaml"
        path.write_text(BASE + "schema_versio: 1\n")
        result = run_cli("serve", env={"SHADOW_PROXY_CONFIG": str(path)})
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert str(path) in result.stderr
        assert "'schema_versio'" in result.stderr

    async def test_environment_variable_starts_a_valid_config(self, tmp_path):
        """A valid file named by the variable serves (checked through /healthz)."""
        port = reserve_port()
        path = tmp_path / "ok.yaml"
        path.write_text(
            f"schema_version: 1\nlisten: {{host: 127.0.0.1, port: {port}}}\n"
            "upstream: {url: 'http://127.0.0.1:9'}\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "SHADOW_PROXY_CONFIG"}
        env["SHADOW_PROXY_CONFIG"] = str(path)
        with Child("proxy", [str(SHADOW_PROXY), "serve"], tmp_path, env=env, cwd=ROOT) as proxy:
            await wait_http_ok(f"http://127.0.0.1:{port}/healthz", 30, children=[proxy])
            assert await proxy.stop(30) == 0

    def test_no_config_at_all(self):
        result = run_cli("serve")
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert "SHADOW_PROXY_CONFIG" in result.stderr

    def test_missing_tokenizer_directory_exits_2(self, tmp_path):
        """The worker cannot load the tokenizer: start-up fails with exit 2 and the reason."""
        missing = tmp_path / "no-such-tokenizer"
        path = tmp_path / "proxy.yaml"
        path.write_text(
            f"schema_version: 1\nlisten: {{host: 127.0.0.1, port: {reserve_port()}}}\n"
            "upstream: {url: 'http://127.0.0.1:9'}\n"
            f"models:\n  - {{name: m, tokenizer: '{missing}'}}\n"
            f"taps:\n  - {{name: a, capture: request, endpoint: '{reserve_endpoint()}'}}\n"
        )
        result = run_cli("--log-level", "error", "serve", "--config", str(path))
        assert result.returncode == 2, result.stderr
        # The line and key of the tokenizer, and what is wrong with it (issue 17).
        assert f"shadow-proxy: {path}:5: 'models[0].tokenizer'" in result.stderr
        assert f"{missing} for model 'm' does not exist" in result.stderr
        assert "'m'" in result.stderr
        assert "Traceback" not in result.stderr


def test_config_error_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nupstream: {url: 'http://x'}\nlisten: {prot: 1}\n")
    result = subprocess.run(
        cli_argv("serve", "--config", str(bad), log_level=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}:3: 'listen.prot' is not a known key" in result.stderr
