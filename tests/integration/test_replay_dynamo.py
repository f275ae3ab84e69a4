"""shadow-replay against the real Dynamo 1.6.1 frontend and mocker (issues 14 and 32).

Two deployments, each a frontend and a mocker serving the deepseek model
directory, prefix caching off (so a deployment that already saw a prompt is not
faster the second time) and Dynamo's own request trace on
(``DYN_REQUEST_TRACE``, jsonl sink, ``request_end`` records):

- ``primary``: 200 fast requests are captured through the proxy in front of it
  (a TTFT of about 5 ms, the tokens a few reads later; under load some come
  in one read);
- ``slow``: the same with the mocker 20 times slower.

(A slower candidate judged against a baseline twin: tests/integration/test_replay.py,
with the built-in frontend.)

What is proven (the figures of issue 32's "Done means" among them):

- an A/A replay against the primary alone reads a TTFT ratio within 0.67-1.5
  and no difference (it read x2.35 higher, or x0.47 lower: the primary timed on
  its slowest records only, from its arrival); the 20x slower candidate reads
  higher with a ratio of at least 2;
- one deployment as candidate and baseline at once answers every request (the
  two copies carried one request id: Dynamo refused the second, 503), and
  Dynamo logs no deprecated ``x-dynamo-request-id``;
- a candidate that does not serve ``--model`` is refused before any request;
- the candidate's engine gets exactly the primary engine's input: Dynamo's
  trace gives, per request, the chained block hashes of the engine's input
  (``replay.input_sequence_hashes``) under Dynamo's own request id, the uuid of
  the response ``id`` the client saw (the record keeps the primary's,
  ``upstream_id``, and pairs.jsonl the candidate's), and they must be equal
  request for request (and so as multisets).
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools.dynamo import REPO, Dynamo, start_dynamo
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.replay.runner import Replay, ReplayOptions
from tests.integration.replay_capture import capture, file_records, load_records
from tests.support.dynamo import require_dynamo

pytestmark = [pytest.mark.dynamo, pytest.mark.slow, pytest.mark.solo, pytest.mark.timeout(400)]

MODEL = REPO / ".models" / "deepseek"
REQUESTS = 200
#: Every tenth request asks for a JSON body (no TTFT to compare).
UNARY_EVERY = 10
#: The primary's mocker and its twin; the slow one is 20 times slower.
SPEEDUP = 10.0
SLOW_SPEEDUP = SPEEDUP / 20


def trace_env(path: Path) -> dict[str, str]:
    return {
        "DYN_REQUEST_TRACE": "1",
        "DYN_REQUEST_TRACE_SINKS": "jsonl",
        "DYN_REQUEST_TRACE_FILE_FORMAT": "jsonl",
        "DYN_REQUEST_TRACE_OUTPUT_PATH": str(path),
        "DYN_REQUEST_TRACE_RECORDS": "request_end",
        "DYN_REQUEST_TRACE_FILE_FLUSH_INTERVAL_MS": "100",
        "DYN_REQUEST_TRACE_JSONL_FLUSH_INTERVAL_MS": "100",
    }


class Deployment:
    """One Dynamo frontend + mocker with its request trace."""

    def __init__(self, name: str, scratch: Path, speedup: float) -> None:
        self.name = name
        self.trace = scratch / f"{name}-trace.jsonl"
        start = start_dynamo(
            MODEL,
            "deepseek",
            scratch / name,
            speedup,
            extra_mocker_args=("--no-enable-prefix-caching",),
            extra_frontend_env=trace_env(self.trace),
        )
        self.procs: Dynamo = asyncio.run(start)  # a module fixture: no loop runs here
        self.url = self.procs.base_url

    def hashes(self) -> dict[str, dict[str, Any]]:
        """Dynamo request id -> the ``request`` of its request_end trace record."""
        out: dict[str, dict[str, Any]] = {}
        if not self.trace.exists():
            return out
        for line in self.trace.read_text().splitlines():
            try:
                event = json.loads(line)["event"]
            except (ValueError, KeyError):
                continue  # a line being written
            if event.get("event_type") == "request_end":
                out[event["request"]["request_id"]] = event["request"]
        return out

    async def wait_trace(self, ids: list[str], timeout: float = 30) -> dict[str, dict[str, Any]]:
        """The trace records of ``ids``, once Dynamo has written them all."""

        def complete() -> dict[str, dict[str, Any]] | None:
            seen = self.hashes()
            return seen if all(i in seen for i in ids) else None

        return await wait_until(
            complete, timeout, 0.1, what=f"{self.name}: trace records of {len(ids)} requests"
        )


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Deployment]]:
    require_dynamo()
    from shadow_proxy.devtools.modeldirs import build_all

    build_all(REPO / ".models")
    scratch = tmp_path_factory.mktemp("dynamo-replay")
    started: dict[str, Deployment] = {}
    try:
        for name, speedup in (("primary", SPEEDUP), ("slow", SLOW_SPEEDUP)):
            started[name] = Deployment(name, scratch, speedup)
        yield started
    finally:
        for deployment in started.values():
            deployment.procs.stop()


def _requests() -> list[tuple[str, dict[str, Any]]]:
    """Chat requests of 20 to 140 prompt tokens (the frontend's own template and
    tokenizer cost grows with the prompt; the replay sends token ids)."""
    out = []
    for k in range(REQUESTS):
        words = " ".join(f"w{(k * 31 + j) % 997}" for j in range(5 + (k * 37) % 60))
        body: dict[str, Any] = {
            "model": "deepseek",
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": f"Request {k}: {words}"},
            ],
            "max_tokens": 8 + k % 9,
            "stream": k % UNARY_EVERY != UNARY_EVERY - 1,
        }
        if k % 3 and body["stream"]:
            body["stream_options"] = {"include_usage": True}
        out.append((f"dyn-{k}", body))
    return out


@pytest.fixture(scope="module")
def captured(deployments: dict[str, Deployment], tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dynamo-captured")
    models = [{"name": "deepseek", "tokenizer": str(MODEL)}]
    # The tap worker as in production (the idle scheduling class: CPU the
    # frontend does not want), 30 ms apart (one record's tokenizing is done
    # before the next request): the primary is timed as it serves alone.
    return asyncio.run(
        capture(
            deployments["primary"].url,
            models,
            _requests(),
            out,
            gap_s=0.03,
            worker={"priority": "idle"},
        )
    )


def _dynamo_id(upstream_id: str) -> str:
    """The response id's uuid: Dynamo's request id in its trace."""
    return upstream_id.split("-", 1)[1]


#: Two copies of a request on this shared 2-core machine differ by more than the
#: default 5% band when the other tests load it (a CI run saw candidate/baseline
#: TTFT above 1.05).
TOLERANCE = 0.25


async def _replay(
    source: Path, out: Path, candidate: str, baseline: str | None, **kw: Any
) -> dict[str, Any]:
    settings: dict[str, Any] = {"speed": 1.0, "concurrency": 8, "max_lag_s": 30.0, **kw}
    options = ReplayOptions(
        candidate=candidate, out_dir=out, baseline=baseline, tokenizer=MODEL, **settings
    )
    records, unreadable = file_records(source)
    return await Replay(options, "shadow-replay (dynamo test)").run(records, unreadable)


def _pairs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]


async def _check_engine_input(
    records: list[dict], pairs: list[dict], deployments: dict[str, Deployment], side: str, name: str
) -> None:
    """The engine behind ``side`` received exactly the primary engine's input."""
    primary_ids = [_dynamo_id(r["response"]["upstream_id"]) for r in records]
    primary = await deployments["primary"].wait_trace(primary_ids)
    by_request = {p["request_id"]: p for p in pairs}
    other_ids = [_dynamo_id(by_request[r["request_id"]][side]["upstream_id"]) for r in records]
    other = await deployments[name].wait_trace(other_ids)
    for record, pid, oid in zip(records, primary_ids, other_ids, strict=True):
        mine, theirs = primary[pid]["replay"], other[oid]["replay"]
        assert theirs["input_sequence_hashes"] == mine["input_sequence_hashes"], record[
            "request_id"
        ]
        assert theirs["input_length"] == mine["input_length"] == len(record["request"]["token_ids"])
    as_multiset = collections.Counter
    assert as_multiset(tuple(other[i]["replay"]["input_sequence_hashes"]) for i in other_ids) == (
        as_multiset(tuple(primary[i]["replay"]["input_sequence_hashes"]) for i in primary_ids)
    )


def _streamed(records: list[dict[str, Any]]) -> int:
    return sum(1 for r in records if r["response"]["streamed"])


class TestAgainstThePrimaryAlone:
    """No baseline: judged against the primary's own latencies from the records
    (the default band is [0.67, 1.5]: the primary went through the frontend's
    template and tokenizer, the replay sends token ids)."""

    async def test_a_a(self, deployments, captured: Path, tmp_path: Path) -> None:
        records = load_records(captured)
        assert len(records) == REQUESTS
        summary = await _replay(captured, tmp_path, deployments["primary"].url, None)
        assert summary["replayed"] == REQUESTS and summary["errors"] == 0
        assert summary["prompt_token_mismatches"] == 0
        assert summary["primary_timed_from"] == {"upstream_send": REQUESTS}
        ttft = summary["ttft_ms"]
        one_read = sum(
            1
            for r in records
            if r["response"]["streamed"]
            and r["response"]["first_token_offset_ns"] == r["response"]["last_token_offset_ns"]
        )
        print(
            f"A/A TTFT: {ttft['judged']} (primary {ttft['primary']}, candidate "
            f"{ttft['candidate']}; {one_read} streamed records came in one read)"
        )
        # Every streamed record has the primary's TTFT, one-read answers included;
        # the JSON bodies have none.
        assert ttft["primary"]["n"] == ttft["n"] == _streamed(records) == REQUESTS * 9 // 10
        assert summary["e2e_ms"]["n"] == REQUESTS
        # The verdict judges the ratio's interval against the band; the p50 alone
        # moves with the machine's load (the primary was captured through the
        # proxy and the frontend's template, sharing two cores with the tap worker:
        # 0.64-0.65 on a loaded machine, the interval still overlapping the band).
        assert ttft["judged"]["ci95"][1] >= 0.67 and ttft["judged"]["ci95"][0] <= 1.5, ttft
        assert ttft["verdict"] == "no_difference", ttft
        assert summary["e2e_ms"]["verdict"] == "no_difference", summary["e2e_ms"]
        await _check_engine_input(records, _pairs(tmp_path), deployments, "candidate", "primary")

    async def test_twenty_times_slower(self, deployments, captured: Path, tmp_path: Path) -> None:
        records = load_records(captured)
        summary = await _replay(
            captured, tmp_path, deployments["slow"].url, None, speed=None, concurrency=16
        )
        assert summary["replayed"] == REQUESTS and summary["errors"] == 0
        assert summary["prompt_token_mismatches"] == 0
        ttft = summary["ttft_ms"]
        print(f"20x slower TTFT: {ttft['judged']}")
        assert ttft["verdict"] == "higher", ttft
        assert ttft["judged"]["ratio_p50"] >= 2, ttft
        assert ttft["judged"]["ci95"][0] >= 1.5, ttft
        pairs = _pairs(tmp_path)
        for line in pairs:
            assert line["candidate"]["prompt_tokens"] == line["prompt_tokens"]
        await _check_engine_input(records, pairs, deployments, "candidate", "slow")


class TestOneDeploymentTwice:
    """The primary's deployment as candidate and as baseline at the same moment."""

    async def test_every_request_answered(self, deployments, captured: Path, tmp_path: Path):
        """Each copy has its own request id: both are answered (the second copy of
        an id in flight was refused, 503 "Unlinked request", for every record)."""
        records = load_records(captured)
        url = deployments["primary"].url
        summary = await _replay(captured, tmp_path, url, url, tolerance=TOLERANCE)
        assert summary["replayed"] == REQUESTS
        assert (summary["errors"], summary["baseline_errors"]) == (0, 0), (
            summary["error_examples"],
            summary["baseline_error_examples"],
        )
        assert summary["baseline_prompt_token_mismatches"] == 0
        # The mocker's outputs are random: outputs differ on both sides alike.
        assert summary["differences"]["outcome"]["differs"] == 0
        await _check_engine_input(records, _pairs(tmp_path), deployments, "baseline", "primary")
        log = deployments["primary"].procs.frontend.stdout_path.read_text(errors="replace")
        assert "x-dynamo-request-id header is deprecated" not in log


class TestRefused:
    """A candidate that cannot answer is refused before any request, in one line."""

    async def test_model_not_served(self, deployments, captured: Path, tmp_path: Path) -> None:
        url = deployments["slow"].url
        out = tmp_path / "out"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shadow_proxy.replay.cli",
            str(captured),
            "--candidate",
            url,
            "--model",
            "other",
            "--out",
            str(out),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 2, err.decode()
        assert err.decode().strip().splitlines()[-1] == (
            f"shadow-replay: candidate {url} does not serve model 'other' (it lists deepseek)"
        )
        assert not out.exists()
