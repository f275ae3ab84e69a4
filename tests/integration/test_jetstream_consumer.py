"""Reading a tap from JetStream with a durable consumer (SPEC 8 and 9, issue 12):
a reader killed mid-read resumes from the durable's position, readers sharing a
durable split the records. ``shadow-consumer --nats`` runs as a real process;
the records come from the real publisher (no proxy needed here). What the
source itself skips and refuses: tests/unit/records/test_jetstream_source.py."""

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
from typing import Any

import nats
import nats.js.errors
import pytest

from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.files import read_entries
from shadow_proxy.records.wire import Message, decode_envelope
from tests.support import ROOT
from tests.support.jetstream import DirectPublisher
from tests.support.nats import messages_in
from tests.support.servers import serve

pytestmark = [pytest.mark.nats, pytest.mark.timeout(90)]

TAP = "direct"
SUBJECT = "shadow.shadow-requests-direct"


def start_consumer(
    urls: list[str], durable: str, directory: Path, name: str, stderr: Any = subprocess.PIPE
) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "shadow_proxy.cli",
        "--log-level",
        "warning",
        "consumer",
        "--nats",
        urls[0],
        "--tap",
        TAP,
        "--durable",
        durable,
        "--ack-wait",
        "2",
        "--interval",
        "0.1",
        "--record",
        str(directory / f"{name}.records"),
        "--summary-path",
        str(directory / f"{name}.json"),
    ]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
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


async def publish_all(urls: list[str], total: int) -> None:
    """``total`` records through the real publisher (which creates the stream),
    all acknowledged."""
    publisher = DirectPublisher(urls, capacity=4096)
    try:
        assert publisher.startup_problem() is None
        publisher.offer(total)
        await wait_until(lambda: publisher.queue.published == total, timeout=30)
    finally:
        publisher.close()


async def pulls_waiting(urls: list[str], durable: str, count: int, timeout: float = 30) -> None:
    """Until ``count`` pull requests wait on the durable of the SHADOW stream."""
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while True:
            try:
                waiting = (await js.consumer_info("SHADOW", durable)).num_waiting or 0
            except nats.js.errors.NotFoundError:
                waiting = 0
            if waiting >= count:
                return
            assert time.monotonic() < deadline, f"{waiting} of {count} readers waiting"
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


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
        readers: list[subprocess.Popen] = []
        try:
            assert publisher.startup_problem() is None  # the stream exists
            readers = [start_consumer(nats_server.urls, "shared", tmp_path, n) for n in "ab"]
            # Both readers wait on the durable before the first record (records
            # already stored could all go to whichever reader starts first).
            await pulls_waiting(nats_server.urls, "shared", 2)
            feeder = publish_in_background(publisher, total, per_step=20)
            await asyncio.to_thread(feeder.join, 30)
            await wait_until(lambda: publisher.queue.published == total, timeout=30)
            await wait_until(
                lambda: len(recorded(tmp_path, "a")) + len(recorded(tmp_path, "b")) >= total,
                timeout=30,
            )
        finally:
            publisher.close()
            totals = [summary(r) for r in readers]
        a, b = recorded(tmp_path, "a"), recorded(tmp_path, "b")
        assert a and b, "both readers got records"
        assert sorted(a + b) == list(range(total)), "each record exactly once"
        assert sum(t["records"] for t in totals) == total


class TestStartedFirst:
    """A consumer started before any proxy has created the stream (pods start in
    any order) waits for it, says so once, and then counts every record."""

    async def test_waits_for_the_stream(self, nats_server, tmp_path):
        total = 500
        log = tmp_path / "early.stderr"
        with log.open("wb") as stderr:
            reader = start_consumer(nats_server.urls, "early", tmp_path, "early", stderr)
        waiting = "no JetStream stream 'SHADOW'"
        try:
            await wait_until(lambda: waiting in log.read_text(), timeout=30, what="the wait")
            asked = messages_in(nats_server)
            await wait_until(
                lambda: messages_in(nats_server) > asked, timeout=30, what="a second look"
            )
            assert reader.poll() is None, log.read_text()[-2000:]
            await publish_all(nats_server.urls, total)  # creates the stream
            await wait_until(lambda: len(recorded(tmp_path, "early")) >= total, timeout=30)
        finally:
            if reader.poll() is None:
                reader.send_signal(signal.SIGTERM)
            out, _ = reader.communicate(timeout=20)
        assert reader.returncode == 0, log.read_text()[-2000:]
        assert json.loads(out)["records"] == total
        assert log.read_text().count(waiting) == 1


class TestMissingStream:
    """The offline tools read what a stream holds: one that does not exist is a
    one-line error and exit 2, never a traceback (the consumer waits instead)."""

    @pytest.mark.parametrize(
        "tool",
        [["shadow-replay", "--candidate", "http://127.0.0.1:9"], ["shadow-trace", "analyze"]],
    )
    def test_usage_error(self, nats_server, tmp_path, tool):
        extra = ["--out", str(tmp_path / "out")] if tool[0] == "shadow-replay" else []
        source = ["--nats", nats_server.urls[0], "--stream", "NOPE", "--tap", TAP, "--durable", "d"]
        argv = [str(Path(sys.prefix) / "bin" / tool[0]), *tool[1:], *extra, *source]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip() == (
            f"{tool[0]}: no JetStream stream 'NOPE' at {nats_server.urls[0]}"
        ), done.stderr[-2000:]


class TestWrongSubject:
    """The offline tools reading a stream say, as the consumer does, which
    subjects it holds when nothing comes on theirs (the ``--topic`` trap)."""

    @pytest.mark.parametrize(
        "tool",
        [
            ["shadow-replay", "--candidate", "CANDIDATE"],
            ["shadow-trace", "analyze", "--duration", "30"],
        ],
    )
    async def test_hint(self, nats_server, tmp_path, tool, model_dirs):
        async with serve(mock_app(MockConfig(models={"deepseek": model_dirs["deepseek"]}))) as url:
            # shadow-replay checks its candidate answers /v1/models before reading.
            await self.hint(nats_server, tmp_path, [url if w == "CANDIDATE" else w for w in tool])

    async def hint(self, nats_server, tmp_path, tool):
        nc = await nats.connect(nats_server.urls)
        try:
            js = nc.jetstream()
            await js.add_stream(name="SHADOW", subjects=["shadow.>"])
            await js.publish("shadow.custom-topic", b"not read")
        finally:
            await nc.close()
        out = ["--out", str(tmp_path / "out")] if tool[0] == "shadow-replay" else []
        source = ["--nats", nats_server.urls[0], "--tap", TAP, "--durable", "d"]
        argv = [str(Path(sys.prefix) / "bin" / tool[0]), *tool[1:], *out, *source]
        log = tmp_path / "stderr"
        hint = (
            f"{tool[0]}: nothing on shadow.shadow-requests-{TAP} in 5 s; stream 'SHADOW' "
            "holds shadow.custom-topic: for a tap with its own topic pass --topic TOPIC"
        )
        with log.open("w") as err:
            reader = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        try:
            await wait_until(lambda: hint in log.read_text(), timeout=30, what="the hint")
        finally:
            reader.send_signal(signal.SIGINT)
            reader.wait(timeout=20)
        assert log.read_text().count(hint) == 1, log.read_text()[-2000:]
