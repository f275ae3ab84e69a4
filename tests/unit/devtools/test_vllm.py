"""The vLLM helper without vLLM: the install check, a server that dies at
start-up, the request log and the metrics it reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shadow_proxy.devtools import vllm

pytestmark = pytest.mark.timeout(60)

HEAD = "(APIServer pid=1) DEBUG 12-02 17:44:43 [request_logger.py:55] Request "
LOG = (
    HEAD + "chatcmpl-abc details: prompt: '<｜User｜>a, b<｜Assistant｜>', "
    "prompt_token_ids: [0, 128803, 19923], prompt_embeds shape: None.\n"
    + HEAD
    + "cmpl-x-1 details: prompt: None, prompt_token_ids: [5, 6], prompt_embeds shape: None.\n"
)


def fake_venv(tmp_path: Path, script: str, stamp: bool = True) -> Path:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text("#!/bin/sh\n" + script + "\n")
    python.chmod(0o755)
    if stamp:
        (tmp_path / "venv" / ".shadow-proxy-vllm-0.32.0").touch()
    return python


class TestInstall:
    """A missing or incomplete venv says so and how to install it."""

    def test_missing(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(vllm.VLLM_PYTHON_ENV, str(tmp_path / "nope" / "python"))
        with pytest.raises(vllm.VllmUnavailable, match=r"install-vllm\.sh"):
            vllm.vllm_python()

    def test_without_stamp(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(vllm.VLLM_PYTHON_ENV, str(fake_venv(tmp_path, "exit 1", stamp=False)))
        with pytest.raises(vllm.VllmUnavailable, match="incomplete"):
            vllm.vllm_python()


class TestStart:
    """A server that exits fails at once with its log's tail, and is reaped."""

    async def test_exits(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        python = fake_venv(tmp_path, 'echo "boom: $@"; exit 3')
        monkeypatch.setenv(vllm.VLLM_PYTHON_ENV, str(python))
        with pytest.raises(
            vllm.VllmStartError, match=r"boom: -m vllm\.entrypoints\.openai\.api_server"
        ):
            await vllm.start_vllm(tmp_path / "model", "m", tmp_path / "scratch", ready_timeout=30)

    def test_environment(self, tmp_path: Path) -> None:
        env = vllm.vllm_env(tmp_path, 2)
        assert (env["VLLM_CPU_KVCACHE_SPACE"], env["HF_HUB_OFFLINE"]) == ("2", "1")
        assert env["HOME"].startswith(str(tmp_path)) and os.path.isdir(env["TMPDIR"])


class TestReadings:
    """Prompt ids from the request log; counters from /metrics text."""

    def test_prompt_ids_in_log(self, tmp_path: Path) -> None:
        child = vllm.Child("vllm-m", ["true"], tmp_path, merge_output=True)
        child.stdout_path.write_text(LOG, encoding="utf-8")
        server = vllm.Vllm(child, "http://127.0.0.1:1", "m", tmp_path)
        assert server.prompt_ids_in_log() == {
            "chatcmpl-abc": [0, 128803, 19923],
            "cmpl-x-1": [5, 6],
        }

    def test_sample(self) -> None:
        text = (
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 7.0\n'
            "vllm:prefix_cache_hits_created 1.0\n"
        )
        assert vllm._sample(text, "vllm:prefix_cache_hits_total") == 7.0


class TestQueued:
    """The fleet's start queue: each server once, the one a caller waits for first."""

    def test_each_name_once(self) -> None:
        # ready("llama-other") queues it with the session's wanted list, which names it too.
        names = ["llama-other", "llama", "llama-tools", "llama-other"]
        assert vllm.queued([], {}, names, "llama-other") == ["llama-other", "llama", "llama-tools"]

    def test_started_and_queued_names_are_not_queued_again(self) -> None:
        got = vllm.queued(
            ["llama-tools"], {"llama": 1}, ["llama", "llama-tools", "llama-other"], None
        )
        assert got == ["llama-tools", "llama-other"]

    def test_the_awaited_name_starts_next(self) -> None:
        got = vllm.queued(
            ["llama", "llama-tools", "llama-other"], {}, ["llama-other"], "llama-other"
        )
        assert got == ["llama-other", "llama", "llama-tools"]

    def test_a_started_name_stays_out(self) -> None:
        assert vllm.queued(["llama-tools"], {"llama-other": 1}, ["llama-other"], "llama-other") == [
            "llama-tools"
        ]
