"""Record files in order: deduplication, unreadable input counted, heartbeats
skipped or yielded, the reorder window."""

from __future__ import annotations

from pathlib import Path

from shadow_proxy.records import files, sources, wire
from tests.support.record_sources import TOPIC, collect, heartbeat, payload, record, write


class TestFileSource:
    """Files in order; each (publisher_id, tap, seq) once; what cannot be read, counted."""

    async def test_order_and_deduplication(self, tmp_path: Path) -> None:
        first = write(tmp_path / "a", record(0), record(1), record(0, publisher=2))
        second = write(tmp_path / "b", record(1), record(2), record(1, tap="other"))
        source = sources.FileSource([first, second])
        found = [
            (d.message.publisher_id, d.envelope["tap"], d.envelope["seq"])
            for d in await collect(source)
        ]
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
            "entry": 1,
            "envelope": 1,
            "record": 1,
            "schema": 1,
            "truncated": 1,
        }
        assert stats["unreadable_bytes"] > len(garbage) + 3
        assert stats["records"] == 2

    async def test_heartbeats_skipped_or_yielded(self, tmp_path: Path) -> None:
        path = write(tmp_path / "a", heartbeat(), record(0), heartbeat(publisher=9, next_seq=1))
        skipped = sources.FileSource([path])
        assert [d.envelope["seq"] for d in await collect(skipped)] == [0]
        assert skipped.stats.heartbeats == 2
        yielded = await collect(sources.FileSource([path], heartbeats=True))
        assert [d.heartbeat.next_seq if d.heartbeat else "record" for d in yielded] == [
            3,
            "record",
            1,
        ]
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
