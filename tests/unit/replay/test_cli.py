"""``shadow-replay``: record files read in arrival order, its arguments and exit
status, and a whole run from the command line against the built-in frontend."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadow_proxy.devtools.frontend import MockConfig, serve_mock_frontend
from shadow_proxy.records import sources
from shadow_proxy.replay.cli import build_parser, deliveries_of, headline, main
from tests.support.replay import joined_record
from tests.support.trace_records import write_records

pytestmark = pytest.mark.timeout(60)


def source_of(*paths: Path) -> sources.RecordSource:
    args = build_parser().parse_args([*map(str, paths), "--candidate", "http://u", "--out", "o"])
    return sources.open_source(args)


class TestEnvelopes:
    """A record file is in publish order; the replay reads it in arrival order
    within the window (acknowledging is the run's, once a pair is written)."""

    async def test_arrival_order(self, tmp_path: Path) -> None:
        arrivals = [30, 10, 20, 0]
        path = write_records(
            tmp_path / "r.rec",
            [joined_record(k, "x", max_tokens=1, arrival_ms=a) for k, a in enumerate(arrivals)],
        )
        got = [d.envelope["seq"] async for d in deliveries_of(source_of(path))]
        assert got == [3, 1, 2, 0]

    async def test_window_bounds_the_reordering(self, tmp_path: Path) -> None:
        records = [joined_record(k, "x", max_tokens=1, arrival_ms=-k) for k in range(4)]
        path = write_records(tmp_path / "r.rec", records)
        got = [d.envelope["seq"] async for d in deliveries_of(source_of(path), window=2)]
        assert got != [3, 2, 1, 0] and sorted(got) == [0, 1, 2, 3]

    async def test_leaves_the_source_open(self, tmp_path: Path) -> None:
        """Acknowledgements come after the last delivery (once its pair is written):
        the caller closes the source, not the reading."""
        path = write_records(tmp_path / "r.rec", [joined_record(0, "x", max_tokens=1)])
        source = source_of(path)
        closed = []
        real_close = source.aclose

        async def aclose() -> None:
            closed.append(True)
            await real_close()

        source.aclose = aclose  # type: ignore[method-assign]
        assert len([d async for d in deliveries_of(source)]) == 1
        assert closed == []


class TestArguments:
    """Bad arguments exit 2 naming the option; good ones are parsed to values."""

    def test_values(self) -> None:
        args = build_parser().parse_args(
            ["r", "--candidate", "http://u", "--out", "o", "--speed", "max", "--max-lag-s", "0"]
        )
        assert (args.speed, args.max_lag_s, args.concurrency) == (None, 0.0, 16)
        assert (
            build_parser()
            .parse_args(["r", "--candidate", "http://u", "--out", "o", "--speed", "2.5"])
            .speed
            == 2.5
        )

    @pytest.mark.parametrize(
        ("option", "value", "message"),
        [
            ("--speed", "0", "must be a positive number or 'max' (got '0')"),
            ("--speed", "fast", "must be a positive number or 'max' (got 'fast')"),
            ("--concurrency", "0", "must be positive (got '0')"),
            ("--reorder-window", "x", "must be an integer (got 'x')"),
            ("--max-lag-s", "-1", "must be at least 0 (got '-1')"),
        ],
    )
    def test_rejected(self, option: str, value: str, message: str, capsys) -> None:
        with pytest.raises(SystemExit) as exit_info:
            main(["r", "--candidate", "http://u", "--out", "o", option, value])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert option in err and message in err

    def test_missing_source(self, tmp_path: Path, capsys) -> None:
        code = main([str(tmp_path / "missing*"), "--candidate", "http://x", "--out", "o"])
        assert code == 2 and "no record files in" in capsys.readouterr().err

    def test_missing_tokenizer(self, tmp_path: Path, capsys) -> None:
        path = write_records(tmp_path / "r.rec", [])
        args = [str(path), "--candidate", "http://u", "--out", "o", "--tokenizer", str(tmp_path)]
        assert main(args) == 2
        assert "'--tokenizer' must name a tokenizer.json" in capsys.readouterr().err

    def test_closed_loop_needs_a_tokenizer(self, tmp_path: Path, capsys) -> None:
        path = write_records(tmp_path / "r.rec", [])
        assert main([str(path), "--candidate", "http://u", "--out", "o", "--closed-loop"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            "shadow-replay: '--closed-loop' needs '--tokenizer': answers are re-encoded in "
            "their frame"
        ]

    def test_closed_loop_values(self) -> None:
        args = build_parser().parse_args(
            ["r", "--candidate", "http://u", "--out", "o", "--closed-loop", "--warmup", "5"]
        )
        assert (args.closed_loop, args.warmup, args.warmup_s) == (True, 5, 0.0)

    @pytest.mark.parametrize("option", ["--candidate", "--baseline"])
    def test_url_without_scheme(self, option: str, capsys) -> None:
        """``127.0.0.1:PORT`` failed every request (NonHttpUrlClientError): now one line."""
        argv = ["r", "--candidate", "http://c", "--out", "o", option, "127.0.0.1:8000"]
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "must be an http:// or https:// URL (got '127.0.0.1:8000')" in (
            capsys.readouterr().err
        )

    @pytest.mark.parametrize("extra", [[], ["--baseline", "http://b", "--no-compare"]])
    def test_score_needs_a_baseline(self, extra: list[str], capsys) -> None:
        """``--score`` without ``--baseline`` (or with ``--no-compare``): one usage line."""
        with pytest.raises(SystemExit) as exit_info:
            main(["r", "--candidate", "http://c", "--out", "o", "--score", *extra])
        assert exit_info.value.code == 2
        assert "--score needs --baseline" in capsys.readouterr().err

    def test_options_have_help(self) -> None:
        """Every option says what it does (--connect-timeout-s, --read-timeout-s,
        --request-id-header had nothing)."""
        missing = [
            a.option_strings[0]
            for a in build_parser()._actions
            if a.option_strings and a.help is None and a.dest != "help"
        ]
        assert missing == []


@contextlib.contextmanager
def frontend_on_a_thread(model_dir: Path, loaded: dict) -> Iterator[str]:
    """The built-in frontend served by a thread with its own event loop, so that
    ``main`` (which runs its own loop and wants the main thread for its signal
    handlers) can run here."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        config = MockConfig(models={"deepseek": model_dir}, ttft_ms=1, itl_ms=1)
        async with serve_mock_frontend(config, loaded) as (url, _app):
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


class TestRun:
    """A whole run: exit 0, the report in DIR and the headline on stderr."""

    def test_replays_a_record_file(self, model_dirs, loaded: dict, tmp_path, capsys) -> None:
        text = loaded["deepseek"].output_text(3)
        path = write_records(
            tmp_path / "r.rec",
            [joined_record(k, text, max_tokens=3, arrival_ms=-k) for k in range(3)],
        )
        out = tmp_path / "out"
        with frontend_on_a_thread(model_dirs["deepseek"], loaded) as url:
            argv = [str(path), "--candidate", url, "--out", str(out), "--speed", "max"]
            code = main([*argv, "--concurrency", "1", "--reorder-window", "8"])
        assert code == 0
        pairs = (out / "pairs.jsonl").read_text().splitlines()
        assert [json.loads(line)["seq"] for line in pairs] == [2, 1, 0]  # arrival order
        summary = json.loads((out / "summary.json").read_text())
        assert summary["replayed"] == 3 and summary["exact_match_rate"] == 1.0
        err = capsys.readouterr().err
        assert headline(summary) in err and f"report: {out / 'report.md'}" in err


async def failing_completions(request) -> object:
    from aiohttp import web

    return web.json_response({"error": {"message": "engine overloaded"}}, status=500)


@contextlib.contextmanager
def app_on_a_thread(app_factory) -> Iterator[str]:
    """An aiohttp app served by a thread with its own loop (see frontend_on_a_thread)."""
    from tests.support.servers import serve

    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def run() -> None:
        async with serve(app_factory()) as url:
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),))
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def models_then_500():
    from aiohttp import web

    app = web.Application()

    async def models(_request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "deepseek"}]})

    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", failing_completions)
    return app


class TestNothingToShow:
    """A run with nothing to judge says so in one line and does not exit 0."""

    def test_no_records(self, tmp_path: Path, capsys) -> None:
        path = write_records(tmp_path / "empty.rec", [])
        with app_on_a_thread(models_then_500) as url:
            code = main([str(path), "--candidate", url, "--out", str(tmp_path / "o")])
        assert code == 2
        err = capsys.readouterr().err
        assert "shadow-replay: no records in the source" in err
        assert not (tmp_path / "o" / "latency.png").exists()

    def test_candidate_not_answering(self, tmp_path: Path, capsys) -> None:
        from shadow_proxy.devtools.processes import reserve_port

        path = write_records(tmp_path / "r.rec", [joined_record(0, "x", max_tokens=1)])
        url = f"http://127.0.0.1:{reserve_port()}"
        code = main([str(path), "--candidate", url, "--out", str(tmp_path / "o")])
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"shadow-replay: candidate {url} does not answer GET /v1/models")
        assert not (tmp_path / "o").exists()  # nothing was replayed

    def test_every_request_failed(self, tmp_path: Path, capsys) -> None:
        records = [joined_record(k, "x", max_tokens=1, arrival_ms=k) for k in range(12)]
        path = write_records(tmp_path / "r.rec", records)
        out = tmp_path / "o"
        with app_on_a_thread(models_then_500) as url:
            code = main([str(path), "--candidate", url, "--out", str(out), "--speed", "max"])
        assert code == 1
        err = capsys.readouterr().err
        assert "every request to the candidate failed (12 of 12): engine overloaded" in err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["errors_by_status"] == {"500": 12}
        assert all(summary[m]["verdict"] == "no_verdict" for m in ("ttft_ms", "e2e_ms"))
        report = (out / "report.md").read_text()
        assert "- candidate, 500: `engine overloaded`" in report

    def test_max_records(self, model_dirs, loaded: dict, tmp_path, capsys) -> None:
        text = loaded["deepseek"].output_text(1)
        records = [joined_record(k, text, max_tokens=1, arrival_ms=k) for k in range(5)]
        path = write_records(tmp_path / "r.rec", records)
        out = tmp_path / "out"
        with frontend_on_a_thread(model_dirs["deepseek"], loaded) as url:
            argv = [str(path), "--candidate", url, "--out", str(out), "--speed", "max"]
            assert main([*argv, "--max-records", "2"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["records"] == 2 and summary["run"]["stopped_by"] == "max_records"
        assert summary["run"]["complete"] is True
