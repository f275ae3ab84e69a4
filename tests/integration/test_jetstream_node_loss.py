"""Readers through node loss (issue 31), on a real three-server JetStream
cluster: while records are published, ``shadow-consumer --nats`` and
``shadow-replay --nats`` (real processes) read them live, the server leading
the consumer's durable is SIGKILLed and later started again. Before, each
reader died with a raw ``ServiceUnavailableError`` traceback from its fetch.
Now: no traceback, the outage said in one line each way, and every record
handled exactly once (the consumer's record file holds each seq once; the
replay sent each once)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from shadow_proxy.devtools.frontend import MockConfig, load_models, serve_mock_frontend
from shadow_proxy.devtools.nats_server import NatsCluster
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.files import read_entries
from shadow_proxy.records.wire import decode_envelope, encode_envelope
from tests.support.replay import joined_record

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.timeout(240)]

TAP = "kv"
SUBJECT = f"shadow.shadow-requests-{TAP}"
RECORDS = 120
#: Records published before the leader is killed, and while it is down.
BEFORE_KILL = 40
WHILE_DOWN = 40


class Publisher:
    """Publishes the records one by one, each again until stored (a stream
    leader may be the server killed: JetStream drops a repeat by its id)."""

    def __init__(self, urls: list[str], records: list[dict[str, Any]]):
        self.urls = urls
        self.records = records
        self.stored = 0

    async def run(self, until: asyncio.Event | None = None, stop_at: int = RECORDS) -> None:
        nc = await nats.connect(self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        try:
            js = nc.jetstream(timeout=2)
            while self.stored < stop_at:
                record = self.records[self.stored]
                headers = {
                    "Shadow-Tap": TAP,
                    "Shadow-Publisher-Id": "7",
                    "Shadow-Seq": str(record["seq"]),
                    "Nats-Msg-Id": f"7.{TAP}.{record['seq']}",
                }
                try:
                    await js.publish(SUBJECT, encode_envelope(record), headers=headers)
                except (nats.errors.Error, TimeoutError):
                    await asyncio.sleep(0.1)
                    continue
                self.stored += 1
                await asyncio.sleep(0.02)
        finally:
            await nc.close()


async def caught_up(urls: list[str], durable: str, count: int) -> bool:
    """The durable delivered ``count`` records and all are acknowledged: its
    reader is idle, fetching (so the kill meets a fetch: 503 until a new leader)."""
    try:
        nc = await nats.connect(urls, connect_timeout=2)
    except (nats.errors.Error, OSError, TimeoutError):
        return False
    try:
        info = await nc.jetstream(timeout=2).consumer_info("SHADOW", durable)
        return info.delivered.stream_seq >= count and info.num_ack_pending == 0
    except (nats.errors.Error, TimeoutError):
        return False
    finally:
        await nc.close()


async def durable_leader(urls: list[str], durable: str) -> str | None:
    try:
        nc = await nats.connect(urls, connect_timeout=2)
    except (nats.errors.Error, OSError, TimeoutError):
        return None
    try:
        info = await nc.jetstream(timeout=2).consumer_info("SHADOW", durable)
        return info.cluster.leader if info.cluster else None
    except (nats.errors.Error, TimeoutError):
        return None
    finally:
        await nc.close()


def tool(name: str, *args: str) -> list[str]:
    if name == "consumer":
        return [sys.executable, "-m", "shadow_proxy.cli", "--log-level", "warning", name, *args]
    code = f"from shadow_proxy.{name}.cli import main; raise SystemExit(main())"
    return [sys.executable, "-c", code, *args]


async def start(argv: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


async def finish(proc: asyncio.subprocess.Process, timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


class TestLeaderKilled:
    async def test_every_record_once_no_traceback(
        self, nats_cluster: NatsCluster, model_dirs, tmp_path: Path
    ) -> None:
        urls = nats_cluster.urls
        nc = await nats.connect(urls)
        try:
            await nc.jetstream().add_stream(
                api.StreamConfig(name="SHADOW", subjects=["shadow.>"], num_replicas=3)
            )
        finally:
            await nc.close()
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=1, itl_ms=1)
        loaded = load_models(config)
        text = loaded["deepseek"].output_text(2)
        records = [joined_record(k, text, max_tokens=2, arrival_ms=k) for k in range(RECORDS)]
        for record in records:
            record["tap"] = TAP
        publisher = Publisher(urls, records)
        source = ["--nats", ",".join(urls), "--tap", TAP, "--max-records", str(RECORDS)]
        recorded = tmp_path / "records"
        async with serve_mock_frontend(config, loaded) as (url, _app):
            consumer = await start(
                tool(
                    "consumer",
                    *source,
                    "--durable",
                    "count",
                    "--record",
                    str(recorded),
                    "--interval",
                    "60",
                )
            )
            replay = await start(
                tool(
                    "replay",
                    *source,
                    "--durable",
                    "replay",
                    "--candidate",
                    url,
                    "--out",
                    str(tmp_path / "replay"),
                    "--speed",
                    "max",
                )
            )
            await publisher.run(stop_at=BEFORE_KILL)
            await wait_until(
                lambda: caught_up(urls, "count", BEFORE_KILL), timeout=60, what="caught up"
            )
            await wait_until(
                lambda: durable_leader(urls, "count"), timeout=60, what="the durable's leader"
            )
            leader_name = await durable_leader(urls, "count")
            leader = next(s for s in nats_cluster.servers if s.name == leader_name)
            leader.kill()
            await publisher.run(stop_at=BEFORE_KILL + WHILE_DOWN)
            leader.start()
            await leader.wait_ready()
            await publisher.run()
            code, out, err = await finish(consumer)
            replay_code, _, replay_err = await finish(replay)
        assert code == 0, err
        assert replay_code == 0, replay_err
        for output in (err, replay_err):
            assert "Traceback" not in output and "ServiceUnavailableError" not in output, output
        # The outage is met by a fetch or by an acknowledgement (which waits it
        # out, resending): a fetch that meets it says so once, and once when over.
        outages = [line for line in err.splitlines() if "not answering" in line]
        assert len(outages) <= 1 and ("answering again" in err) == bool(outages), err
        summary = json.loads(out)
        assert summary["records"] == RECORDS and summary["duplicates"] == 0, summary
        seqs = [decode_envelope(entry.payload)["seq"] for entry in read_entries(recorded)]
        assert sorted(seqs) == list(range(RECORDS)), "each record written exactly once"
        replayed = json.loads((tmp_path / "replay" / "summary.json").read_text())
        assert replayed["replayed"] == RECORDS and replayed["errors"] == 0, replayed
        print("consumer:", summary.get("nats_retries"), "retries;", err.strip()[-600:])


class TestEveryServerDown:
    """The whole cluster (here: its one server) gone, then back: the reader waits,
    counting its retries, and goes on with the same durable; nothing lost, nothing
    handled twice."""

    async def test_reader_waits_for_the_cluster(self, nats_server: NatsCluster, tmp_path) -> None:
        urls = nats_server.urls
        nc = await nats.connect(urls)
        try:
            await nc.jetstream().add_stream(api.StreamConfig(name="SHADOW", subjects=["shadow.>"]))
        finally:
            await nc.close()
        records = [joined_record(k, "x", max_tokens=1, arrival_ms=k) for k in range(40)]
        for record in records:
            record["tap"] = TAP
        publisher = Publisher(urls, records)
        summary_path = tmp_path / "summary.json"
        argv = tool(
            "consumer",
            "--nats",
            urls[0],
            "--tap",
            TAP,
            "--durable",
            "wait",
            "--max-records",
            "40",
            "--interval",
            "0.2",
            "--summary-path",
            str(summary_path),
        )
        consumer = await start(argv)
        await publisher.run(stop_at=20)
        await wait_until(lambda: caught_up(urls, "wait", 20), timeout=60, what="caught up")
        [server] = nats_server.servers
        server.kill()

        def retried() -> bool:
            try:
                return json.loads(summary_path.read_text()).get("nats_retries", 0) > 0
            except (OSError, ValueError):
                return False

        await wait_until(retried, timeout=60, what="the reader retrying")
        server.start()
        await server.wait_ready()
        await publisher.run(stop_at=40)
        code, out, err = await finish(consumer)
        assert code == 0 and "Traceback" not in err, err
        summary = json.loads(out)
        # Each record once. A lone server SIGKILLed may lose acknowledgements it had
        # not yet written to its store: those records come again after the restart
        # (seen: 13 of 20), and are counted as duplicates, not handled again.
        assert summary["records"] == 40, summary
        assert summary["nats_retries"] > 0
