"""The record-source reader: files and a live tap, deduplication, unreadable input
counted, heartbeats skipped or yielded; the source arguments."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records import files, sources, wire
from shadow_proxy.records.envelope import build_envelope
from tests.support.tap_messages import publisher

TOPIC = "shadow-requests-kv"


def payload(seq: int, tap: str = "kv", **overrides) -> bytes:
    envelope = build_envelope(
        tap=tap, seq=seq, request_id=f"r{seq}", origin="chat", filters=[],
        arrival_unix_ns=1, sample_rate=1.0, request={"token_ids": [1]}, response=None,
    )  # fmt: skip
    envelope.update(overrides)
    return wire.encode_envelope(envelope)


def record(seq: int, publisher: int = 1, tap: str = "kv", **overrides) -> wire.Message:
    return wire.Message(TOPIC, publisher, seq, 0, payload(seq, tap, **overrides))


def heartbeat(publisher: int = 1, next_seq: int = 3) -> wire.Message:
    beat = wire.Heartbeat("kv", publisher, next_seq, next_seq - 1).encode()
    return wire.Message(wire.heartbeat_topic(TOPIC), publisher, 0, 0, beat)


def write(path: Path, *entries: wire.Message | bytes) -> Path:
    with path.open("wb") as f:
        for entry in entries:
            f.write(files.encode_entry(entry) if isinstance(entry, wire.Message) else entry)
    return path


async def collect(source: sources.RecordSource) -> list[sources.Delivery]:
    found = [delivery async for delivery in source]
    await source.aclose()
    return found


class TestFileSource:
    """Files in order; each (publisher_id, tap, seq) once; what cannot be read, counted."""

    async def test_order_and_deduplication(self, tmp_path: Path) -> None:
        first = write(tmp_path / "a", record(0), record(1), record(0, publisher=2))
        second = write(tmp_path / "b", record(1), record(2), record(1, tap="other"))
        source = sources.FileSource([first, second])
        found = [(d.message.publisher_id, d.envelope["tap"], d.envelope["seq"])
                 for d in await collect(source)]  # fmt: skip
        assert found == [(1, "kv", 0), (1, "kv", 1), (2, "kv", 0), (1, "kv", 2), (1, "other", 1)]
        assert (source.stats.records, source.stats.duplicates, source.stats.files) == (5, 1, 2)

    async def test_progress_in_bytes(self, tmp_path: Path) -> None:
        """Bytes read and in all: the total and ETA of a progress line."""
        first = write(tmp_path / "a", record(0), record(1))
        second = write(tmp_path / "b", record(2))
        source = sources.FileSource([first, second])
        total = first.stat().st_size + second.stat().st_size
        assert source.progress() == (0, total)
        seen = []
        async for _ in source.deliveries():
            seen.append(source.progress()[0])
        assert 0 < seen[0] < seen[1] <= first.stat().st_size < seen[2] <= total
        assert source.progress() == (total, total)

    async def test_without_dedup_every_record_comes(self, tmp_path: Path) -> None:
        path = write(tmp_path / "a", record(0), record(0))
        assert len(await collect(sources.FileSource([path], dedup=False))) == 2

    async def test_publisher_0_is_never_a_repeat(self, tmp_path: Path) -> None:
        bare = payload(3)
        path = write(tmp_path / "old", files.LENGTH.pack(len(bare)) + bare, record(3, publisher=0))
        source = sources.FileSource([path])
        assert [d.envelope["seq"] for d in await collect(source)] == [3, 3]
        assert source.stats.duplicates == 0

    async def test_unreadable_input_is_counted_by_reason(self, tmp_path: Path) -> None:
        garbage = b"\x93\x01\x02\x03"
        path = write(
            tmp_path / "a",
            record(0),
            files.LENGTH.pack(len(garbage)) + garbage,  # not an entry
            wire.Message(TOPIC, 1, 1, 0, b"\xc1"),  # not an envelope
            record(1, schema_version=2),  # another schema
            record(2, request="x"),  # not a record
            record(3),
            b"\x00\x00\x01",  # a truncated tail
        )
        source = sources.FileSource([path])
        assert [d.envelope["seq"] for d in await collect(source)] == [0, 3]
        stats = source.stats.as_dict()
        assert stats["unreadable"] == {
            "entry": 1, "envelope": 1, "record": 1, "schema": 1, "truncated": 1,
        }  # fmt: skip
        assert stats["unreadable_bytes"] > len(garbage) + 3
        assert stats["records"] == 2

    async def test_heartbeats_skipped_or_yielded(self, tmp_path: Path) -> None:
        path = write(tmp_path / "a", heartbeat(), record(0), heartbeat(publisher=9, next_seq=1))
        skipped = sources.FileSource([path])
        assert [d.envelope["seq"] for d in await collect(skipped)] == [0]
        assert skipped.stats.heartbeats == 2
        yielded = await collect(sources.FileSource([path], heartbeats=True))
        assert [d.heartbeat.next_seq if d.heartbeat else "record" for d in yielded] == [
            3, "record", 1,
        ]  # fmt: skip
        assert yielded[0].envelope is None and yielded[0].where == str(path)

    async def test_a_heartbeat_from_another_publisher_is_refused(self, tmp_path: Path) -> None:
        beat = wire.Heartbeat("kv", 5, 1, None).encode()
        path = write(tmp_path / "a", wire.Message(wire.heartbeat_topic(TOPIC), 6, 0, 0, beat))
        source = sources.FileSource([path], heartbeats=True)
        assert await collect(source) == []
        assert source.stats.unreadable == {"heartbeat": 1}

    async def test_ack_is_a_no_op(self, tmp_path: Path) -> None:
        [delivery] = await collect(sources.FileSource([write(tmp_path / "a", record(0))]))
        await delivery.ack()


def send(socket: zmq.Socket, message: wire.Message) -> None:
    socket.send_multipart(
        wire.encode_frames(message.topic, message.publisher_id, message.sequence, 0,
                           message.payload)
    )  # fmt: skip


@contextlib.asynccontextmanager
async def reading(source: sources.TapSource) -> AsyncIterator[list[sources.Delivery]]:
    """Deliveries collected by a task while the block runs."""
    found: list[sources.Delivery] = []

    async def read() -> None:
        async for delivery in source:
            found.append(delivery)

    task = asyncio.create_task(read())
    try:
        yield found
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await source.aclose()


class TestTapSource:
    """A live tap on a real SUB socket: exact topics, dedup, heartbeats."""

    async def test_records_and_heartbeats(self) -> None:
        with publisher() as (socket, endpoint):
            source = sources.TapSource([endpoint], TOPIC, heartbeats=True)
            assert source.live and source.describe() == f"topic {TOPIC} at {endpoint}"
            async with reading(source) as found:
                # The first sends may go before the subscription arrives (slow
                # joiner): repeat seq 0 until it comes; the repeats are duplicates.
                await wait_until(lambda: send(socket, record(0)) or found, 10)
                send(socket, wire.Message(TOPIC + "-sibling", 1, 0, 0, payload(9)))
                send(socket, heartbeat(next_seq=2))
                send(socket, record(1))
                await wait_until(lambda: len(found) >= 3, 10)
            kinds = [("beat", d.heartbeat.next_seq) if d.heartbeat else ("rec", d.envelope["seq"])
                     for d in found]  # fmt: skip
            assert kinds == [("rec", 0), ("beat", 2), ("rec", 1)]  # repeats of seq 0: once
            assert found[0].where == endpoint
            assert source.stats.unreadable.get("topic") == 1  # the sibling: prefix match only
            assert source.stats.records == 2

    async def test_aclose_is_idempotent(self) -> None:
        source = sources.TapSource(["tcp://127.0.0.1:1"], TOPIC)
        await source.aclose()
        await source.aclose()


def arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sources.add_arguments(parser)
    return parser.parse_args(list(argv))


class TestOpenSource:
    """The arguments name exactly one source, or ``SourceError`` says what is missing."""

    def test_files(self, tmp_path: Path) -> None:
        write(tmp_path / "a", record(0))
        source = sources.open_source(arguments(str(tmp_path)))
        assert isinstance(source, sources.FileSource) and not source.live

    async def test_live_tap(self) -> None:
        source = sources.open_source(arguments("--endpoint", "tcp://127.0.0.1:1", "--topic", "t"))
        assert isinstance(source, sources.TapSource)
        await source.aclose()

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            ((), "give one source"),
            (("x.mpk", "--topic", "t"), "got files and tap"),
            (("--topic", "t"), "needs --topic and --endpoint"),
            (("--discover", "http://127.0.0.1:1/shadow/taps"), "--discover needs --tap"),
            (("--nats", "nats://127.0.0.1:1", "--tap", "kv"), "--nats needs --tap NAME and"),
            (("--discover", "http://127.0.0.1:1/shadow/taps", "--tap", "kv"), "discovery failed"),
        ],
    )
    def test_errors(self, tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
        with pytest.raises(sources.SourceError, match=message):
            sources.open_source(arguments(*argv))

    def test_nats_servers_repeated_or_comma_separated(self) -> None:
        """``--nats a,b`` was a raw ValueError traceback from the NATS client."""
        args = arguments("--nats", "nats://a:4222,nats://b:4222", "--nats", "nats://c:4222",
                         "--tap", "kv", "--durable", "d")  # fmt: skip
        source = sources.open_source(args)
        assert source.servers == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
        assert source.live and not source.stop_at_end
        args = arguments("--nats", "nats://a:4222", "--tap", "kv", "--durable", "d",
                         "--stop-at-end")  # fmt: skip
        batch = sources.open_source(args)
        assert batch.stop_at_end and not batch.live

    def test_stop_at_end_is_for_streams(self, tmp_path: Path) -> None:
        write(tmp_path / "a", record(0))
        with pytest.raises(sources.SourceError, match="--stop-at-end is for a JetStream stream"):
            sources.open_source(arguments(str(tmp_path), "--stop-at-end"))

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(sources.SourceError, match="no record file at"):
            sources.open_source(arguments(str(tmp_path / "absent")))
