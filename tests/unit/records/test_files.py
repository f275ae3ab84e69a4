"""Record files: rotation, reading order, damaged bytes, old files."""

from __future__ import annotations

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
