"""``shadow-trace`` and ``shadow-replay`` reading a JetStream stream, as processes,
against a real nats-server (issue 32's items 4 and 5).

- read live and stopped by SIGTERM, ``shadow-trace`` analyses what it read (it
  said "nothing to analyze") and only then acknowledges it; when its output
  cannot be written it acknowledges nothing, so the next run reads the records;
- with ``--stop-at-end`` both tools stop at the stream's end by themselves
  (they ran on for ever), ``shadow-replay`` acknowledging each record as its
  pair is written, ``--max-records`` leaving the rest to the next run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from shadow_proxy.devtools.frontend import MockConfig, load_models, serve_mock_frontend
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.wire import encode_envelope
from tests.support.replay import joined_record
from tests.support.trace_records import envelope

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.timeout(180)]

TAP = "kv"
SUBJECT = f"shadow.shadow-requests-{TAP}"
RECORDS = 30


async def fill(urls: list[str], records: list[dict[str, Any]]) -> None:
    """The SHADOW stream holding ``records`` as one publisher's tap messages."""
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream()
        await js.add_stream(name="SHADOW", subjects=["shadow.>"])
        for record in records:
            headers = {
                "Shadow-Tap": TAP,
                "Shadow-Publisher-Id": "5",
                "Shadow-Seq": str(record["seq"]),
            }
            await js.publish(SUBJECT, encode_envelope(record), headers=headers)
    finally:
        await nc.close()


async def consumer_state(urls: list[str], durable: str) -> tuple[int, int]:
    """(records delivered, of them not acknowledged) of a durable."""
    nc = await nats.connect(urls)
    try:
        info = await nc.jetstream().consumer_info("SHADOW", durable)
        return info.delivered.stream_seq, info.num_ack_pending
    finally:
        await nc.close()


def tool(name: str, *args: str) -> list[str]:
    code = f"from shadow_proxy.{name}.cli import main; raise SystemExit(main())"
    return [sys.executable, "-c", code, *args]


def source(urls: list[str], durable: str, *extra: str) -> list[str]:
    return ["--nats", ",".join(urls), "--tap", TAP, "--durable", durable, *extra]


async def run(argv: list[str], timeout: float = 120) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, (out + err).decode(errors="replace")


def trace_records() -> list[dict[str, Any]]:
    return [
        envelope(k, list(range(k % 5, k % 5 + 40)), tap=TAP, arrival_ms=k) for k in range(RECORDS)
    ]


class TestTraceStopped:
    """A live read stopped by a signal: what was read is used, then acknowledged."""

    async def test_sigterm_analyses_what_was_read(self, nats_server, tmp_path: Path) -> None:
        await fill(nats_server.urls, trace_records())
        out = tmp_path / "reuse.json"
        argv = tool(
            "trace",
            "analyze",
            *source(nats_server.urls, "live"),
            "--json",
            str(out),
            "--block-size",
            "16",
        )
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            # Everything delivered, and held unacknowledged until the output is written.
            await wait_until(
                lambda: delivered_all(nats_server.urls, "live"),
                timeout=60,
                what="the durable delivered every record",
            )
            assert (await consumer_state(nats_server.urls, "live"))[1] == RECORDS
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        err = stderr.decode()
        assert proc.returncode == 0, err
        assert f"{RECORDS} records, {RECORDS} used" in err
        document = json.loads(out.read_text())
        assert document["all"]["16"]["requests"] == RECORDS
        await wait_until(
            lambda: acknowledged_all(nats_server.urls, "live"),
            timeout=20,
            what="every record acknowledged once the analysis was written",
        )

    async def test_nothing_acknowledged_when_the_output_fails(self, nats_server, tmp_path):
        await fill(nats_server.urls, trace_records())
        missing = tmp_path / "no-such-dir" / "trace.jsonl"
        argv = tool(
            "trace",
            "export",
            *source(nats_server.urls, "fails", "--stop-at-end"),
            "--format",
            "mooncake",
            "-o",
            str(missing),
        )
        code, output = await run(argv)
        assert code == 2, output
        assert await consumer_state(nats_server.urls, "fails") == (RECORDS, RECORDS)


async def delivered_all(urls: list[str], durable: str) -> bool:
    try:
        return (await consumer_state(urls, durable))[0] == RECORDS
    except nats.js.errors.NotFoundError:  # the reader has not made its durable yet
        return False


async def acknowledged_all(urls: list[str], durable: str) -> bool:
    return await consumer_state(urls, durable) == (RECORDS, 0)


class TestStopAtEnd:
    """``--stop-at-end``: a batch read of what the stream holds ends by itself."""

    async def test_trace_export(self, nats_server, tmp_path: Path) -> None:
        await fill(nats_server.urls, trace_records())
        out = tmp_path / "trace.jsonl"
        argv = tool(
            "trace",
            "export",
            *source(nats_server.urls, "batch", "--stop-at-end"),
            "--format",
            "mooncake",
            "-o",
            str(out),
        )
        code, output = await run(argv)
        assert code == 0, output
        assert len(out.read_text().splitlines()) == RECORDS
        assert await consumer_state(nats_server.urls, "batch") == (RECORDS, 0)

    async def test_replay(self, nats_server, model_dirs, tmp_path: Path) -> None:
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=1, itl_ms=1)
        loaded = load_models(config)
        text = loaded["deepseek"].output_text(2)
        records = [joined_record(k, text, max_tokens=2, arrival_ms=k) for k in range(RECORDS)]
        for record in records:
            record["tap"] = TAP
        await fill(nats_server.urls, records)
        async with serve_mock_frontend(config, loaded) as (url, _app):
            first = tool(
                "replay",
                *source(nats_server.urls, "replay", "--stop-at-end"),
                "--candidate",
                url,
                "--out",
                str(tmp_path / "a"),
                "--speed",
                "max",
                "--max-records",
                "10",
            )
            code, output = await run(first)
            assert code == 0, output
            summary = json.loads((tmp_path / "a" / "summary.json").read_text())
            assert summary["replayed"] == 10 and summary["run"]["stopped_by"] == "max_records"
            rest = tool(
                "replay",
                *source(nats_server.urls, "replay", "--stop-at-end"),
                "--candidate",
                url,
                "--out",
                str(tmp_path / "b"),
                "--speed",
                "max",
            )
            code, output = await run(rest)
        assert code == 0, output
        summary = json.loads((tmp_path / "b" / "summary.json").read_text())
        assert summary["run"]["stopped_by"] == "end" and summary["errors"] == 0
        # The first run's fetched but unread records were given back at once.
        assert summary["replayed"] == RECORDS - 10
        assert await consumer_state(nats_server.urls, "replay") == (RECORDS, 0)
