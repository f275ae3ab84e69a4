"""Record files: rotation, reading order, damaged bytes, old files."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from shadow_proxy.records import files, wire


class TestRecordFile:
    """Raw records are length-prefixed and rotate by size."""

    def test_rotation(self, tmp_path):
        path = tmp_path / "records.bin"
        recorder = files.RecordFile(path, max_bytes=150, keep=2)
        payloads = [bytes([i]) * 10 for i in range(7)]
        for i, payload in enumerate(payloads):  # 71 bytes an entry with the prefix
            recorder.write(wire.Message("t", 1, i, 0, payload))
        recorder.close()
        assert files.read_payloads(path) == payloads[6:]
        assert files.read_payloads(tmp_path / "records.bin.1") == payloads[4:6]
        assert files.read_payloads(tmp_path / "records.bin.2") == payloads[2:4]
        assert not (tmp_path / "records.bin.3").exists()


def message(seq: int, publisher: int = 1, topic: str = "t") -> wire.Message:
    return wire.Message(topic, publisher, seq, 1000 + seq, f"payload {seq}".encode())


def write_file(path: Path, seqs: range | list[int], publisher: int = 1) -> Path:
    writer = files.RecordFile(path, max_bytes=2**20, keep=1)
    for seq in seqs:
        writer.write(message(seq, publisher))
    writer.close()
    return path


class TestEntries:
    """An entry keeps every transport field; old bare envelopes read as publisher 0."""

    def test_round_trip_keeps_the_message(self, tmp_path: Path) -> None:
        path = write_file(tmp_path / "r", [0, 1], publisher=77)
        assert list(files.read_entries(path)) == [message(0, 77), message(1, 77)]

    def test_bare_envelope_files_read_with_publisher_0(self, tmp_path: Path) -> None:
        body = wire.encode_envelope({"schema_version": 1, "tap": "kv", "seq": 4})
        path = tmp_path / "old"
        path.write_bytes(files.LENGTH.pack(len(body)) + body)
        [entry] = files.read_entries(path)
        assert entry == wire.Message("kv", 0, 0, 0, body)

    def test_decode_entry_refuses_what_is_no_message(self) -> None:
        assert files.decode_entry(b"\xc1") is None
        assert files.decode_entry(msgpack.packb([1, 2])) is None
        assert files.decode_entry(msgpack.packb({"payload": b"x", "publisher_id": -1})) is None
        bad_topic = {"payload": b"x", "publisher_id": 1, "sequence": 0, "topic": 5}
        assert files.decode_entry(msgpack.packb(bad_topic)) is None


class TestDamagedBytes:
    """Damaged bytes are reported with their offset and size; reading never raises."""

    def test_a_damaged_entry_is_skipped_and_reading_goes_on(self, tmp_path: Path) -> None:
        path = write_file(tmp_path / "r", [0])
        garbage = b"\x93\x01\x02\x03"  # a MessagePack array: no message
        good = files.encode_entry(message(1))
        with path.open("ab") as f:
            f.write(files.LENGTH.pack(len(garbage)) + garbage + good)
        entries = list(files.read_entries(path))
        assert entries[0] == message(0) and entries[2] == message(1)
        damaged = entries[1]
        assert isinstance(damaged, files.Unreadable)
        assert (damaged.reason, damaged.skipped_bytes) == ("entry", 4 + len(garbage))
        assert damaged.offset == len(files.encode_entry(message(0)))

    @pytest.mark.parametrize("tail", [b"\x00\x00", b"\x00\x00\x00\x09abc", b"\xff\xff\xff\xff"])
    def test_a_truncated_tail_ends_the_file(self, tmp_path: Path, tail: bytes) -> None:
        path = write_file(tmp_path / "r", [0])
        size = path.stat().st_size
        with path.open("ab") as f:
            f.write(tail)
        *good, last = files.read_entries(path)
        assert good == [message(0)]
        assert last == files.Unreadable(str(path), size, "truncated", len(tail))


class TestReadingOrder:
    """Specs in the order given; a rotated set oldest first; sets sorted by name."""

    def test_rotated_set_oldest_first(self, tmp_path: Path) -> None:
        writer = files.RecordFile(tmp_path / "a.mpk", max_bytes=60, keep=3)
        for seq in range(6):  # about 40 bytes an entry: one entry per file
            writer.write(message(seq))
        writer.close()
        order = files.expand([tmp_path])
        assert [p.name for p in order] == ["a.mpk.3", "a.mpk.2", "a.mpk.1", "a.mpk"]
        seqs = [m.sequence for p in order for m in files.read_entries(p)]
        assert seqs == sorted(seqs) == [2, 3, 4, 5]

    def test_sets_sorted_by_name_and_hidden_files_skipped(self, tmp_path: Path) -> None:
        for name in ("b", "a.1", "a", "b.2", ".a.123.tmp"):
            (tmp_path / name).write_bytes(b"")
        assert [p.name for p in files.expand([tmp_path])] == ["a.1", "a", "b.2", "b"]

    def test_globs_and_paths_keep_the_given_order_without_repeats(self, tmp_path: Path) -> None:
        for name in ("x.mpk", "x.mpk.1", "y.mpk"):
            (tmp_path / name).write_bytes(b"")
        specs = [tmp_path / "y.mpk", str(tmp_path / "x.mpk*"), tmp_path / "y.mpk"]
        assert [p.name for p in files.expand(specs)] == ["y.mpk", "x.mpk.1", "x.mpk"]

    @pytest.mark.parametrize("spec", ["missing.mpk", "none-*.mpk", "empty"])
    def test_a_spec_naming_nothing_is_an_error(self, tmp_path: Path, spec: str) -> None:
        (tmp_path / "empty").mkdir()
        with pytest.raises(FileNotFoundError, match="no record file"):
            files.expand([str(tmp_path / spec)])


class TestWriting:
    """The writer flushes by time and at close; ``keep=0`` keeps no old file."""

    def test_flushed_after_the_interval(self, tmp_path: Path) -> None:
        path = tmp_path / "r"
        writer = files.RecordFile(path, max_bytes=2**20, keep=1, flush_interval_s=0.0)
        writer.write(message(0))
        assert list(files.read_entries(path)) == [message(0)]  # on disk before close
        writer.close()

    def test_not_flushed_before_the_interval_then_flushed(self, tmp_path: Path) -> None:
        path = tmp_path / "r"
        writer = files.RecordFile(path, max_bytes=2**20, keep=1, flush_interval_s=3600)
        writer.write(message(0))
        assert path.read_bytes() == b""  # buffered: a crash would lose it
        writer.flush()
        assert list(files.read_entries(path)) == [message(0)]
        writer.close()

    def test_keep_zero(self, tmp_path: Path) -> None:
        writer = files.RecordFile(tmp_path / "r", max_bytes=50, keep=0)
        for seq in range(3):
            writer.write(message(seq))
        writer.close()
        assert [p.name for p in tmp_path.iterdir()] == ["r"]
        assert list(files.read_entries(tmp_path / "r")) == [message(2)]
