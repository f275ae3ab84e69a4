"""shadow-replay end to end with real parts: the proxy (and its tap worker) in front
of a built-in frontend, ``shadow-consumer --record`` writing a rotated record set,
then a replay to a candidate built-in frontend made slower and divergent on a
known fraction of requests, with a baseline identical to the primary. Every
number of the summary is checked against what the frontends were told to do
and against pairs.jsonl."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from shadow_proxy.devtools.frontend import MockConfig, diverges, load_models, serve_mock_frontend
from shadow_proxy.devtools.processes import reserve_port, wait_until
from shadow_proxy.records import files
from shadow_proxy.replay.runner import Replay, ReplayOptions
from tests.integration.replay_capture import capture, file_records, load_records

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.solo]

REQUESTS = 40
MAX_TOKENS = 24
DIVERGE_AT = 5  # inside the first cycle of the built-in output: ids diverge here too
FRACTION = 0.3
PRIMARY = {"ttft_ms": 10.0, "itl_ms": 2.0}
STREAMED = {f"cap-{k}" for k in range(REQUESTS) if k % 2 == 0}
SLOW = {"ttft_ms": 90.0, "itl_ms": 8.0, "diverge_fraction": FRACTION, "diverge_at": DIVERGE_AT}


@pytest.fixture(scope="module")
def loaded(model_dirs: dict[str, Path]) -> dict:
    return load_models(MockConfig(models={"deepseek": model_dirs["deepseek"]}))


def _frontend(model_dirs: dict, loaded: dict, **knobs: Any) -> Any:
    config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, **knobs)
    return serve_mock_frontend(config, loaded)


@pytest.fixture(scope="module")
def captured(model_dirs: dict, loaded: dict, tmp_path_factory) -> Path:
    """A rotated record set of REQUESTS joined records captured through the proxy."""
    out = tmp_path_factory.mktemp("captured")
    models = [{"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])}]
    requests = [
        (
            f"cap-{k}",
            {
                "model": "deepseek",
                "messages": [{"role": "user", "content": f"question {k} " * k}],
                "max_tokens": MAX_TOKENS,
                "stream": k % 2 == 0,
            },
        )
        for k in range(REQUESTS)
    ]

    async def run() -> Path:
        async with _frontend(model_dirs, loaded, **PRIMARY) as (primary, _app):
            return await capture(primary, models, requests, out, max_bytes=12000)

    return asyncio.run(run())


async def replay(source: Path, out: Path, candidate: str, baseline: str | None, **kw) -> dict:
    options = ReplayOptions(
        candidate=candidate,
        out_dir=out,
        baseline=baseline,
        speed=None,
        concurrency=4,
        tokenizer=Path(".models/deepseek"),
        **kw,
    )
    records, unreadable = file_records(source)
    return await Replay(options, "shadow-replay test").run(records, unreadable)


def pairs(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]


def p(values: list[float]) -> dict:
    points = np.percentile(np.asarray(values, dtype=float), (50, 90, 99))
    return {f"p{q}": round(float(v), 3) for q, v in zip((50, 90, 99), points, strict=True)}


class TestCapturedSet:
    """The capture is what the replay reads: a rotated set, read oldest first."""

    def test_rotated_and_ordered(self, captured: Path) -> None:
        paths = files.expand([captured])
        assert len(paths) > 2, paths
        assert paths[-1].name == "joined.rec" and paths[0].name.endswith(f".{len(paths) - 1}")
        ids = [r["request_id"] for r in load_records(captured)]
        assert ids == [f"cap-{k}" for k in range(REQUESTS)]


class TestSlowerDivergentCandidate:
    """Slower and diverging on a known fraction; the baseline is the primary's twin."""

    async def test_every_number(self, captured: Path, model_dirs, loaded, tmp_path) -> None:
        records = load_records(captured)
        async with (
            _frontend(model_dirs, loaded, **SLOW) as (candidate, _a),
            _frontend(model_dirs, loaded, **PRIMARY) as (baseline, _b),
        ):
            summary = await replay(captured, tmp_path, candidate, baseline)
        lines = pairs(tmp_path)
        diverged = {r["request_id"] for r in records if diverges(r["request_id"], FRACTION)}
        assert 0 < len(diverged) < REQUESTS

        assert summary["records"] == summary["replayed"] == REQUESTS
        assert summary["skipped"] == {} and summary["errors"] == 0
        assert summary["run"]["complete"] and summary["run"]["unreadable"] == {}
        assert summary["compared"] == REQUESTS and summary["output_basis"] == {"token_ids": 40}
        assert summary["exact_match_rate"] == round((REQUESTS - len(diverged)) / REQUESTS, 6)
        assert summary["first_divergence"] == {"p50": 5, "p90": 5, "p99": 5, "n": len(diverged)}
        assert summary["prompt_token_mismatches"] == 0
        assert summary["differences"] == {
            "outcome": {"differs": 0, "noise": 0, "counted": 0},
            "finish_reason": {"differs": 0, "noise": 0, "counted": 0},
            "output_tokens": {"differs": 0, "noise": 0, "counted": 0},
            "output": {"differs": len(diverged), "noise": 0, "counted": len(diverged)},
        }
        by_id = {line["request_id"]: line for line in lines}
        assert set(by_id) == {r["request_id"] for r in records}
        for r in records:
            line = by_id[r["request_id"]]
            assert line["prompt_tokens"] == len(r["request"]["token_ids"])
            assert line["candidate"]["prompt_tokens"] == line["prompt_tokens"]
            # exact counts on both sides only where the record has usage
            exact = "usage" in r["response"]
            assert line["candidate_diff"]["output_tokens_delta"] == (0 if exact else None)
            expected = (
                {"choice": 0, "position": DIVERGE_AT} if r["request_id"] in diverged else None
            )
            assert line["candidate_diff"]["divergence"] == expected
            assert line["baseline_diff"]["output_equal"] is True
            assert line["counted"]["output"] is (r["request_id"] in diverged)
            # The primary timed from the proxy's send upstream; a JSON body has no TTFT.
            response = r["response"]
            ttft_ns = response["first_token_offset_ns"] - response["upstream_sent_offset_ns"]
            streamed = response["streamed"]
            assert streamed is (r["request_id"] in STREAMED)
            assert line["primary"]["ttft_ms"] == (round(ttft_ns / 1e6, 3) if streamed else None)
            assert line["primary"]["timed_from"] == "upstream_send"
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            entry = summary[metric]
            for side in ("primary", "candidate", "baseline"):
                values = [line[side][metric] for line in lines]
                have = [v for v in values if v is not None]
                expected = {**p(have), "n": len(have)}  # from 3-decimal values
                assert entry[side] == pytest.approx(expected, abs=0.002), (metric, side)
            both = [
                (c, q)
                for c, q in ((ln["candidate"][metric], ln["primary"][metric]) for ln in lines)
                if c is not None and q is not None
            ]
            ratio = np.median([c for c, _ in both]) / np.median([q for _, q in both])
            assert entry["ratio_p50"] == pytest.approx(ratio, rel=1e-3)  # paired: same records
            assert entry["n"] == len(both)
            assert entry["verdict"] == "higher", (metric, entry)
            lo, hi = entry["candidate_vs_baseline_ci95"]
            assert lo <= entry["candidate_vs_baseline_p50"] <= hi
        assert summary["ttft_ms"]["candidate"]["p50"] >= SLOW["ttft_ms"]
        assert summary["itl_ms"]["candidate"]["p50"] >= SLOW["itl_ms"]
        assert summary["ttft_ms"]["candidate_vs_baseline_ci95"][0] > 2

        report = (tmp_path / "report.md").read_text()
        assert f"| exact match rate | {summary['exact_match_rate']:.4g} |" in report
        n = len(diverged)
        assert f"| output | {n} | 0 | {n} |" in report
        for png in ("latency.png", "divergence.png"):
            assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class TestIdenticalCandidate:
    """A candidate identical to the primary: no difference reported."""

    async def test_no_difference(self, captured: Path, model_dirs, loaded, tmp_path) -> None:
        async with (
            _frontend(model_dirs, loaded, **PRIMARY) as (candidate, _a),
            _frontend(model_dirs, loaded, **PRIMARY) as (baseline, _b),
        ):
            summary = await replay(captured, tmp_path, candidate, baseline)
        assert summary["exact_match_rate"] == 1.0
        assert all(v["counted"] == 0 for v in summary["differences"].values())
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert summary[metric]["verdict"] == "no_difference", summary[metric]


class TestBadInput:
    """Unreadable bytes counted, request-only records skipped or replayed for load,
    a dead candidate recorded per request while the replay goes on."""

    async def test_unreadable_and_request_only(
        self, captured: Path, tmp_path: Path, loaded, model_dirs
    ) -> None:
        source = tmp_path / "src"
        source.mkdir()
        records = load_records(captured)[:6]
        with (source / "mixed.rec").open("wb") as f:
            for k, r in enumerate(records):
                if k % 2:
                    r = {key: v for key, v in r.items() if key != "response"}
                payload = msgpack.packb(r)
                f.write(struct.pack(">I", len(payload)) + payload)
            f.write(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # not MessagePack
        async with _frontend(model_dirs, loaded, **PRIMARY) as (candidate, _a):
            summary = await replay(source, tmp_path / "a", candidate, None)
            assert summary["records"] == 6 and summary["replayed"] == 3
            assert summary["skipped"] == {"no_response": 3}
            assert summary["run"]["unreadable"] == {"entry": 1}
            assert summary["ttft_ms"]["judged_against"] == "primary"
            load = await replay(source, tmp_path / "b", candidate, None, compare=False)
            assert load["replayed"] == 6 and load["skipped"] == {} and load["compared"] == 0
        dead = f"http://127.0.0.1:{reserve_port()}"
        summary = await replay(source, tmp_path / "c", dead, None)
        assert summary["replayed"] == 3 and summary["errors"] == 3
        assert summary["errors_by_status"] == {"connection": 3}
        assert summary["differences"]["outcome"]["counted"] == 3
        assert all("Connect" in line["candidate"]["error"] for line in pairs(tmp_path / "c"))
        # Failed requests give no latency verdict ("lower" before) and are not
        # "no common basis" for the outputs.
        assert all(summary[m]["verdict"] == "no_verdict" for m in ("ttft_ms", "e2e_ms"))
        assert summary["e2e_ms"]["candidate"] is None
        assert summary["not_compared"] == {"failed": 3, "no_common_basis": 0}


class TestCommandLine:
    """The console script as a process: Ctrl-C writes the report of what was done
    (its arguments and a whole run in-process: tests/unit/replay/test_cli.py)."""

    @pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
    async def test_interrupt(
        self, captured: Path, model_dirs, loaded, tmp_path: Path, sig: int, status: int
    ) -> None:
        """Ctrl-C exits 130; SIGTERM, a service being stopped, exits 0: both after
        writing the report of what was done."""
        async with _frontend(model_dirs, loaded, ttft_ms=400) as (candidate, _a):
            script = Path(sys.executable).parent / "shadow-replay"
            args = [
                str(script),
                str(captured),
                "--candidate",
                candidate,
                "--out",
                str(tmp_path),
                "--speed",
                "max",
                "--concurrency",
                "1",
            ]
            proc = await asyncio.create_subprocess_exec(
                *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            pairs_file = tmp_path / "pairs.jsonl"
            await wait_until(
                lambda: pairs_file.exists() and pairs_file.read_text().count("\n") >= 2, timeout=30
            )
            proc.send_signal(sig)
            _out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == status, err.decode()
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["run"]["complete"] is False and summary["run"]["stopped_by"] == "signal"
        assert 2 <= summary["replayed"] < REQUESTS
        assert summary["replayed"] == len(pairs(tmp_path))
        assert "interrupted" in (tmp_path / "report.md").read_text()
        assert b"records=" in err
