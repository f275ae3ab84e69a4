"""The Dynamo launcher without Dynamo: finding it, its environment, the processes it
starts (a stand-in interpreter), readiness and stopping. (Against the real Dynamo:
tests/integration/test_dynamo_smoke.py and test_dynamo.py.)"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from aiohttp import web

from shadow_proxy.devtools import dynamo
from shadow_proxy.devtools.processes import Child, wait_until
from tests.support.servers import serve

#: A stand-in for Dynamo's interpreter: says how it was called, then runs until killed.
FAKE_PYTHON = f"""#!{sys.executable}
import os, sys, time
print("argv", *sys.argv[1:], flush=True)
print("env", os.environ.get("DYN_FILE_KV"), os.environ.get("HOME"), flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def launcher(python: Path, scratch: Path, base_url: str = "http://127.0.0.1:9") -> dynamo.Dynamo:
    frontend = Child(
        "frontend",
        [str(python), "-m", "dynamo.frontend"],
        scratch,
        merge_output=True,
        signal_group=True,
    )
    return dynamo.Dynamo(python, frontend, base_url, "m", scratch)


class TestFindingDynamo:
    """A missing or broken install says what is wrong and how to install it."""

    def test_missing(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(dynamo.DYNAMO_PYTHON_ENV, str(tmp_path / "absent"))
        with pytest.raises(dynamo.DynamoUnavailable, match=r"absent does not exist; run scripts"):
            dynamo.dynamo_python()

    def test_an_interpreter_without_dynamo(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(dynamo.DYNAMO_PYTHON_ENV, sys.executable)
        with pytest.raises(dynamo.DynamoUnavailable, match=r"cannot import dynamo\.frontend"):
            dynamo.dynamo_python()


class TestEnvironment:
    """Everything on loopback, discovery in the scratch folder, no inherited DYN_ vars."""

    def test_env(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DYN_LOG", "debug")
        monkeypatch.setenv("NATS_SERVER", "nats://elsewhere")
        env = dynamo.dynamo_env(tmp_path)
        assert "DYN_LOG" not in env and "NATS_SERVER" not in env
        assert env["DYN_FILE_KV"] == str(tmp_path / "discovery")
        assert env["HOME"] == str(tmp_path / "home") and env["TMPDIR"] == str(tmp_path / "tmp")
        assert all((tmp_path / d).is_dir() for d in ("home", "tmp", "discovery"))
        hosts = [k for k in env if k.startswith("DYN_") and k.endswith("_HOST")]
        assert hosts and all(env[k] == "127.0.0.1" for k in hosts)
        assert env["HF_HUB_OFFLINE"] == "1"


class TestProcesses:
    """Mockers start with their model, name and endpoint; stopping reaps everything."""

    async def test_mocker_command_and_stop(self, tmp_path: Path, fake_python: Path) -> None:
        d = launcher(fake_python, tmp_path)
        mocker = d.start_mocker(
            tmp_path / "model", "m-slow", speedup=2.0, component="mslow", extra_args=("--x", "1")
        )
        d.frontend.start()
        try:
            await wait_until(lambda: "env" in mocker.read_output(), 30, children=[mocker])
            words = mocker.read_output().split()
            assert words[:7] == [
                "argv",
                "-m",
                "dynamo.mocker",
                "--model-path",
                str((tmp_path / "model").resolve()),
                "--model-name",
                "m-slow",
            ]
            assert words[7:13] == [
                "--speedup-ratio",
                "2.0",
                "--endpoint",
                "dyn://dynamo.mslow.generate",
                "--x",
                "1",
            ]
            assert words[14:16] == [str(tmp_path / "discovery"), str(tmp_path / "home")]
            assert d.mocker is mocker and mocker.name == "mocker-mslow"
        finally:
            d.stop(timeout=5)
        assert not any(child.alive for child in d.children)
        assert "--- frontend log" in d.logs_tail() and "--- mocker-mslow log" in d.logs_tail()

    def test_kill_mocker_and_stop_what_was_started(self, tmp_path: Path, fake_python: Path) -> None:
        d = launcher(fake_python, tmp_path)
        mocker = d.start_mocker(tmp_path, "m", speedup=1.0)
        try:
            d.kill_mocker()
            assert not mocker.alive and mocker.exit_status == -9
        finally:
            d.stop(timeout=5)


class TestReadiness:
    """Ready when the model is listed and answers; else an error with the logs."""

    async def test_ready(self, tmp_path: Path, fake_python: Path) -> None:
        async def models(_request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m"}]})

        async def chat(_request: web.Request) -> web.Response:
            return web.json_response({"choices": []})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        async with serve(app) as url:
            d = launcher(fake_python, tmp_path, url)
            d.frontend.start()
            try:
                await d.wait_model("m", [d.frontend], timeout=10)
            finally:
                d.stop(timeout=5)

    async def test_not_listed_in_time(self, tmp_path: Path, fake_python: Path) -> None:
        async def models(_request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "other"}]})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        async with serve(app) as url:
            d = launcher(fake_python, tmp_path, url)
            d.frontend.start()
            try:
                with pytest.raises(dynamo.DynamoStartError, match=r"(?s)'other'.*--- frontend"):
                    await d.wait_model("m", [d.frontend], timeout=0.5)
            finally:
                d.stop(timeout=5)

    async def test_a_process_that_exits(self, tmp_path: Path) -> None:
        d = launcher(Path(sys.executable), tmp_path)  # "-m dynamo.frontend": no such module
        d.frontend.start()
        try:
            with pytest.raises(dynamo.DynamoStartError, match=r"(?s)exited.*No module named"):
                await d.wait_model("m", [d.frontend], timeout=30)
        finally:
            d.stop(timeout=5)
