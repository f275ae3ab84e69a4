"""Reading a tap from JetStream with a durable consumer (SPEC 8 and 9, issue 12):
a reader killed mid-read resumes from the durable's position, readers sharing a
durable split the records, and what is not a record of the tap is counted and
skipped. ``shadow-consumer --nats`` runs as a real process; the records come
from the real publisher (no proxy needed here)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nats
import pytest

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.files import read_entries
from shadow_proxy.records.jetstream_source import JetStreamSource
from shadow_proxy.records.wire import Message, decode_envelope, encode_envelope
from tests.integration.jetstream_helpers import DirectPublisher, synthetic_payload
from tests.support import ROOT

pytestmark = [pytest.mark.nats, pytest.mark.timeout(90)]

TAP = "direct"
SUBJECT = "shadow.shadow-requests-direct"


def start_consumer(urls: list[str], durable: str, directory: Path, name: str) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "shadow_proxy.cli", "--log-level", "warning", "consumer",
        "--nats", urls[0], "--tap", TAP, "--durable", durable, "--ack-wait", "2",
        "--interval", "0.1", "--record", str(directory / f"{name}.records"),
        "--summary-path", str(directory / f"{name}.json"),
    ]  # fmt: skip
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def recorded(directory: Path, name: str) -> list[int]:
    """The seqs a consumer wrote to its record file (flushed before each ack)."""
    path = directory / f"{name}.records"
    if not path.exists():
        return []
    entries = [e for e in read_entries(path) if isinstance(e, Message)]
    return [decode_envelope(entry.payload)["seq"] for entry in entries]


def summary(process: subprocess.Popen) -> dict:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err.decode()[-2000:]
    return json.loads(out)


def publish_in_background(
    publisher: DirectPublisher, total: int, per_step: int
) -> threading.Thread:
    """``total`` records, ``per_step`` every 20 ms: a live stream, read while it grows."""

    def run() -> None:
        for _ in range(total // per_step):
            publisher.offer(per_step)
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class TestResume:
    """A reader killed mid-read (SIGKILL) and started again counts every record,
    and reads again only what it had not acknowledged."""

    async def test_killed_and_restarted(self, nats_server, tmp_path):
        total = 3000
        publisher = DirectPublisher(nats_server.urls, capacity=4096)
        try:
            assert publisher.startup_problem() is None
            feeder = publish_in_background(publisher, total, per_step=20)
            first = start_consumer(nats_server.urls, "resume", tmp_path, "first")
            try:
                await wait_until(lambda: len(recorded(tmp_path, "first")) >= 500, timeout=30)
                first.kill()
                first.wait(10)
            finally:
                if first.poll() is None:
                    first.kill()
                first.communicate()
            await asyncio.to_thread(feeder.join, 30)
            await wait_until(lambda: publisher.queue.published == total, timeout=30)
        finally:
            publisher.close()
        seen_first = recorded(tmp_path, "first")
        assert 500 <= len(seen_first) < total, "killed in the middle of the stream"

        second = start_consumer(nats_server.urls, "resume", tmp_path, "second")
        try:
            await wait_until(
                lambda: set(seen_first) | set(recorded(tmp_path, "second")) == set(range(total)),
                timeout=30,
            )
        finally:
            totals = summary(second)
        seen_second = recorded(tmp_path, "second")
        assert len(seen_first) == len(set(seen_first))
        assert len(seen_second) == len(set(seen_second)) == totals["records"]
        # Only what the first reader had handled and not yet acknowledged comes
        # again (its last batch at most): the second resumed at the durable's position.
        again = set(seen_first) & set(seen_second)
        assert len(again) <= 256, len(again)
        assert totals["tap_gaps"] == 0
        assert totals["undecodable"] == {}


class TestSharedDurable:
    """Two readers on one durable split the records: each record to one of them."""

    async def test_split(self, nats_server, tmp_path):
        total = 2000
        publisher = DirectPublisher(nats_server.urls, capacity=4096)
        try:
            assert publisher.startup_problem() is None
            publisher.offer(total)
            await wait_until(lambda: publisher.queue.published == total, timeout=30)
        finally:
            publisher.close()
        readers = [start_consumer(nats_server.urls, "shared", tmp_path, n) for n in "ab"]
        try:
            await wait_until(
                lambda: len(recorded(tmp_path, "a")) + len(recorded(tmp_path, "b")) >= total,
                timeout=30,
            )
        finally:
            totals = [summary(r) for r in readers]
        a, b = recorded(tmp_path, "a"), recorded(tmp_path, "b")
        assert a and b, "both readers got records"
        assert sorted(a + b) == list(range(total)), "each record exactly once"
        assert sum(t["records"] for t in totals) == total


class TestNotRecords:
    """Messages on the tap's subjects that are not its records are counted by
    reason, acknowledged (never delivered again) and skipped."""

    async def test_rejected(self, nats_server):
        nc = await nats.connect(nats_server.urls)
        js = nc.jetstream()
        await js.add_stream(name="SHADOW", subjects=["shadow.>"])
        good = {"Shadow-Tap": TAP, "Shadow-Publisher-Id": "7", "Shadow-Seq": "0"}
        await js.publish(SUBJECT, synthetic_payload(TAP, 0), headers=good)
        await js.publish(SUBJECT, b"\xc1 not msgpack", headers={**good, "Shadow-Seq": "1"})
        await js.publish(SUBJECT, synthetic_payload(TAP, 2), headers={"Shadow-Tap": TAP})
        other = {**good, "Shadow-Tap": "other", "Shadow-Seq": "3"}
        await js.publish(SUBJECT, synthetic_payload("other", 3), headers=other)
        await js.publish(
            SUBJECT, encode_envelope({"tap": TAP}), headers={**good, "Shadow-Seq": "4"}
        )
        await js.publish(SUBJECT, synthetic_payload(TAP, 0), headers=good)  # a repeat
        await js.publish(SUBJECT, synthetic_payload(TAP, 5), headers={**good, "Shadow-Seq": "5"})
        await nc.close()

        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "strict")
        deliveries = source.deliveries()
        try:
            got = []
            for _ in range(2):
                delivery = await asyncio.wait_for(anext(deliveries), 5)
                got.append((delivery.message.publisher_id, delivery.envelope["seq"]))
                await delivery.ack()
            assert got == [(7, 0), (7, 5)]
            assert source.stats.unreadable == {"envelope": 1, "headers": 1, "tap": 1, "record": 1}
            assert source.stats.duplicates == 1
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(deliveries), 1.5)
        finally:
            await deliveries.aclose()
            await source.aclose()
        # A second reader on the same durable gets nothing again: all was acknowledged.
        again = JetStreamSource(nats_server.urls, "SHADOW", TAP, "strict")
        stream = again.deliveries()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(stream), 3)
        finally:
            await stream.aclose()
            await again.aclose()
