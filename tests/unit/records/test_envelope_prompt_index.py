"""Batch records: ``prompt_index`` in the envelope, and every reader keeps each prompt's record."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_proxy.records import wire
from shadow_proxy.records.envelope import build_envelope, check_envelope
from shadow_proxy.records.files import RecordFile
from shadow_proxy.records.sources import FileSource

REQUEST = {"model": "m", "token_ids": [1, 2]}


def envelope(seq: int, prompt_index: int | None) -> dict:
    return build_envelope(
        tap="t",
        seq=seq,
        request_id="rid",
        origin="completions",
        filters=[],
        arrival_unix_ns=1,
        sample_rate=1.0,
        request=REQUEST,
        response=None,
        prompt_index=prompt_index,
    )


class TestEnvelope:
    """``prompt_index`` is present only for a batch's records, and checked."""

    def test_left_out_for_one_prompt(self) -> None:
        assert "prompt_index" not in envelope(0, None)
        assert envelope(0, 0)["prompt_index"] == 0

    @pytest.mark.parametrize(("value", "reason"), [(3, None), (-1, "record"), ("1", "record")])
    def test_checked(self, value, reason) -> None:
        assert check_envelope({**envelope(0, None), "prompt_index": value}) == reason


class TestSources:
    """Dedup is by (publisher_id, tap, seq): the prompts of one request all arrive."""

    async def test_each_prompt_is_delivered_once(self, tmp_path: Path) -> None:
        record_file = RecordFile(tmp_path / "records.mpk", max_bytes=1 << 20, keep=2)
        payloads = [wire.encode_envelope(envelope(seq, seq)) for seq in range(3)]
        for sequence, payload in enumerate([*payloads, payloads[1]]):  # one redelivered
            record_file.write(wire.Message("topic", 7, sequence, 0, payload))
        record_file.close()
        source = FileSource([tmp_path / "records.mpk"])
        got = [d.envelope async for d in source]
        assert [(e["request_id"], e["prompt_index"]) for e in got] == [
            ("rid", 0),
            ("rid", 1),
            ("rid", 2),
        ]
        assert source.stats.duplicates == 1
