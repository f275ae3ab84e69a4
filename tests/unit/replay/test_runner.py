"""One replay run against the built-in frontend on loopback: each record sent,
compared with the primary's answer and written as a pair; records that cannot
be replayed counted; the report written whatever ends the run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest

from shadow_proxy.devtools.frontend import MockConfig, serve_mock_frontend
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.replay.runner import Replay, ReplayOptions, load_tokenizer
from tests.support.replay import joined_record

pytestmark = pytest.mark.timeout(60)

MAX_TOKENS = 4


async def feed(records: Iterable[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for record in records:
        yield record


def options(out: Path, candidate: str, **kwargs: Any) -> ReplayOptions:
    return ReplayOptions(candidate=candidate, out_dir=out, speed=None, concurrency=2, **kwargs)


def pairs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]


@pytest.fixture
async def fast(model_dirs: dict[str, Path], loaded: dict) -> AsyncIterator[str]:
    config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=1, itl_ms=1)
    async with serve_mock_frontend(config, loaded) as (url, _app):
        yield url


class TestRun:
    """Records in, pairs and a report out."""

    async def test_pairs_summary_and_report(self, fast: str, loaded: dict, tmp_path: Path):
        same = loaded["deepseek"].output_text(MAX_TOKENS)
        records = [joined_record(k, same, max_tokens=MAX_TOKENS, arrival_ms=k) for k in range(3)]
        records.append(joined_record(3, "something else", max_tokens=MAX_TOKENS))
        records.append(joined_record(4, same, max_tokens=MAX_TOKENS, response=False))
        summary = await Replay(options(tmp_path, fast), "shadow-replay t").run(
            feed(records), lambda: {"entry": 2}
        )
        assert (summary["records"], summary["replayed"]) == (5, 4)
        assert summary["skipped"] == {"no_response": 1}
        assert summary["compared"] == 4 and summary["exact_match_rate"] == 0.75
        assert summary["differences"]["output"]["counted"] == 1
        run = summary["run"]
        assert run["complete"] is True and run["unreadable"] == {"entry": 2}
        assert (run["candidate"], run["speed"], run["concurrency"]) == (fast, "max", 2)
        lines = sorted(pairs(tmp_path), key=lambda line: line["seq"])
        assert [line["request_id"] for line in lines] == ["rid-0", "rid-1", "rid-2", "rid-3"]
        assert {line["tap"] for line in lines} == {"joined"}
        assert all(line["model"] == "deepseek" and line["prompt_tokens"] == 5 for line in lines)
        assert lines[3]["candidate_diff"]["output_equal"] is False
        assert lines[3]["counted"]["output"] is True
        assert json.loads((tmp_path / "summary.json").read_text()) == summary
        assert "shadow-replay t" in (tmp_path / "report.md").read_text()

    async def test_baseline_at_the_same_moment(self, fast: str, loaded: dict, tmp_path: Path):
        same = loaded["deepseek"].output_text(MAX_TOKENS)
        records = [joined_record(k, same, max_tokens=MAX_TOKENS) for k in range(2)]
        replay = Replay(options(tmp_path, fast, baseline=fast), "shadow-replay t")
        summary = await replay.run(feed(records))
        assert summary["ttft_ms"]["judged_against"] == "baseline"
        assert all("baseline" in line and "baseline_diff" in line for line in pairs(tmp_path))

    async def test_load_only(self, fast: str, tmp_path: Path):
        records = [joined_record(k, "x", max_tokens=2, response=k == 0) for k in range(3)]
        summary = await Replay(options(tmp_path, fast, compare=False), "t").run(feed(records))
        assert summary["replayed"] == 3 and summary["compared"] == 0
        assert all(
            set(line)
            == {"request_id", "tap", "seq", "model", "prompt_tokens", "sent_ids", "candidate"}
            for line in pairs(tmp_path)
        )
        assert pairs(tmp_path)[0]["sent_ids"] == {"candidate": "rid-0-candidate"}

    async def test_model_sent_instead(self, fast: str, tmp_path: Path):
        records = [joined_record(0, "x", max_tokens=2, model="other")]
        await Replay(options(tmp_path, fast, model="deepseek"), "t").run(feed(records))
        [line] = pairs(tmp_path)
        assert line["model"] == "deepseek" and line["candidate"]["outcome"] == "complete"


class Delivered:
    """A record as a source delivers it; ``ack`` notes whether its pair was on disk."""

    def __init__(self, envelope: dict[str, Any], out: Path, acks: list[tuple[str, bool]]):
        self.envelope = envelope
        self._out, self._acks = out, acks

    async def ack(self) -> None:
        written = (self._out / "pairs.jsonl").read_text()
        self._acks.append((self.envelope["request_id"], self.envelope["request_id"] in written))


class TestAcknowledgement:
    """A delivery is acknowledged once its pair line is written (or it was counted as
    skipped): a JetStream record in flight when the run stops comes again."""

    async def test_after_the_pair_is_written(self, fast: str, loaded: dict, tmp_path: Path):
        same = loaded["deepseek"].output_text(MAX_TOKENS)
        acks: list[tuple[str, bool]] = []
        records = [joined_record(k, same, max_tokens=MAX_TOKENS) for k in range(4)]
        records.append(joined_record(4, same, max_tokens=MAX_TOKENS, response=False))
        await Replay(options(tmp_path, fast), "t").run(
            feed(Delivered(r, tmp_path, acks) for r in records)
        )
        assert sorted(acks) == [
            ("rid-0", True),
            ("rid-1", True),
            ("rid-2", True),
            ("rid-3", True),
            ("rid-4", False),
        ]

    async def test_not_before(self, model_dirs, loaded: dict, tmp_path: Path):
        """Cancelled while the candidate is answering: nothing acknowledged."""
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=20_000)
        acks: list[tuple[str, bool]] = []
        async with serve_mock_frontend(config, loaded) as (slow, _app):
            replay = Replay(options(tmp_path, slow), "t")
            records = [
                Delivered(joined_record(k, "x", max_tokens=2), tmp_path, acks) for k in range(3)
            ]
            run = asyncio.create_task(replay.run(feed(records)))
            await wait_until(lambda: replay.scheduler.counts.in_flight >= 2, timeout=10)
            run.cancel()
            summary = await run
        assert acks == [] and summary["run"]["stopped_by"] == "signal"


async def broken_source(records: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for record in records:
        yield record
    raise ConnectionError("the stream went away")


class TestStops:
    """The run's end is said in the summary; a failing source still leaves a report."""

    async def test_source_fails(self, fast: str, loaded: dict, tmp_path: Path):
        same = loaded["deepseek"].output_text(MAX_TOKENS)
        records = [joined_record(k, same, max_tokens=MAX_TOKENS) for k in range(3)]
        with pytest.raises(ConnectionError):
            await Replay(options(tmp_path, fast), "t").run(broken_source(records))
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["run"]["stopped_by"] == "error" and summary["run"]["complete"] is False
        assert summary["run"]["error"] == "ConnectionError: the stream went away"
        assert summary["replayed"] == len(pairs(tmp_path)) == 3
        assert "The run failed: ConnectionError" in (tmp_path / "report.md").read_text()

    async def test_duration_on_a_quiet_source(self, fast: str, tmp_path: Path):
        async def quiet() -> AsyncIterator[dict[str, Any]]:
            yield joined_record(0, "x", max_tokens=2)
            await asyncio.Event().wait()  # a live tap with nothing more to say
            yield {}

        summary = await Replay(options(tmp_path, fast, duration_s=0.5), "t").run(quiet())
        assert summary["run"]["stopped_by"] == "duration" and summary["replayed"] == 1


class TestCancelled:
    """Cancelling the run (Ctrl-C) still writes the report of what was done."""

    async def test_report_of_what_was_done(self, model_dirs, loaded: dict, tmp_path: Path):
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=20_000)
        async with serve_mock_frontend(config, loaded) as (slow, _app):
            replay = Replay(options(tmp_path, slow), "t")
            records = [joined_record(k, "x", max_tokens=2) for k in range(5)]
            run = asyncio.create_task(replay.run(feed(records)))
            await wait_until(lambda: replay.scheduler.counts.in_flight >= 1, timeout=10)
            run.cancel()
            summary = await run
        assert summary["run"]["complete"] is False and summary["replayed"] == 0
        assert summary["run"]["stopped_by"] == "signal"
        assert run.cancelling() == 0  # the run took the cancellation as its end
        assert "interrupted" in (tmp_path / "report.md").read_text()


class TestBaselineOrder:
    """With a baseline, both copies go at the same moment and each is sent first
    every other time (the first sent gets ahead: it read as a difference)."""

    async def test_alternates(self, loaded: dict, tmp_path: Path):
        from aiohttp import web

        from tests.support.servers import serve

        arrivals: list[str] = []

        async def completions(request: web.Request) -> web.StreamResponse:
            arrivals.append(request.headers["x-request-id"].rsplit("-", 1)[1])
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            choice = {"index": 0, "text": "x", "finish_reason": "length"}
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        async with serve(app) as url:
            opts = options(tmp_path, url, baseline=url)
            opts = ReplayOptions(**{**attrs.asdict(opts, recurse=False), "concurrency": 1})
            records = [joined_record(k, "x", max_tokens=1) for k in range(6)]
            summary = await Replay(opts, "t").run(feed(records))
        assert summary["replayed"] == 6 and summary["tolerance"] == 0.05
        firsts = arrivals[::2]
        assert firsts.count("candidate") == firsts.count("baseline") == 3

    async def test_default_tolerance(self, fast: str, tmp_path: Path):
        """Against the primary alone the band is [0.67, 1.5] (another path: the
        frontend's template and tokenizer), against a baseline 5%."""
        records = [joined_record(0, "x", max_tokens=2)]
        alone = await Replay(options(tmp_path / "a", fast), "t").run(feed(records))
        assert alone["tolerance"] == 0.5
        given = await Replay(options(tmp_path / "b", fast, tolerance=0.1), "t").run(feed(records))
        assert given["tolerance"] == 0.1


class TestTokenizer:
    """``--tokenizer`` names a tokenizer.json or its directory."""

    def test_directory_or_file(self, model_dirs) -> None:
        directory = model_dirs["deepseek"]
        assert load_tokenizer(directory).encode("hi").ids
        assert load_tokenizer(directory / "tokenizer.json").encode("hi").ids

    def test_missing(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"'--tokenizer' must name a tokenizer\.json"):
            load_tokenizer(tmp_path)
