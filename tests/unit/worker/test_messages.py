"""Messages between the worker's main and its shards: what one side writes, the
other reads back; the placeholder seq is found and overwritten in place."""

from __future__ import annotations

from shadow_proxy.records import wire
from shadow_proxy.records.envelope import build_envelope
from shadow_proxy.worker import messages as sw


def envelope_bytes(tap: str = "kv-history_1") -> bytes:
    return wire.encode_envelope(
        build_envelope(
            tap=tap, seq=sw.SEQ_PLACEHOLDER, request_id="seq \xa3seq", origin="chat",
            filters=[], arrival_unix_ns=1, sample_rate=1.0,
            request={"token_ids": [2**64 - 1, 5], "seq": 7}, response=None,
        )
    )  # fmt: skip


class TestSeq:
    """The envelope's own seq (not a look-alike later in the record) is overwritten."""

    def test_seq_written_in_place(self) -> None:
        data = envelope_bytes()
        offset = sw.seq_offset(data)
        assert offset > 0
        for seq in (0, 1, 2**40 + 3):
            patched = sw.with_seq(data, offset, seq)
            assert len(patched) == len(data)
            decoded = wire.decode_envelope(patched)
            assert decoded["seq"] == seq
            assert decoded["request"] == {"token_ids": [2**64 - 1, 5], "seq": 7}

    def test_no_placeholder(self) -> None:
        assert sw.seq_offset(wire.encode_envelope({"seq": 3})) == -1


class TestMessages:
    def test_round_trips(self) -> None:
        assert sw.parse_hello(sw.hello(7, 1234)) == (7, 1234)
        payload = envelope_bytes()
        assert sw.parse_record(sw.record(3, 99, 12, payload)) == (3, 99, 12, payload)
        assert sw.parse_drop(sw.drop(2, "worker_died", 5)) == (2, 5, "worker_died")
        assert sw.parse_skip(sw.skip(1, "sample")) == (1, "sample")
        key = b"\x00" * 7 + b"\x09"
        # A batch owes one record per prompt: a tap repeats.
        assert sw.parse_settle(sw.settle(key, [1, 1, 0], False)) == (key, (1, 1, 0), False)
        assert sw.parse_settle(sw.settle(key, [], True)) == (key, (), True)
        assert sw.parse_info(sw.ready({"policy": "idle"})) == {"policy": "idle"}
        families = [["x", "counter", "doc", [["x_total", {}, 1.0]]]]
        assert sw.parse_metrics(sw.metrics(families)) == families
        assert sw.parse_retire(sw.retire(2048)) == 2048
        assert sw.failed("no tokenizer")[1] == b"no tokenizer"
        assert sw.exit_message() == [sw.EXIT]
