"""Control messages: each kind round-trips; anything else is a ``ControlError``."""

from __future__ import annotations

import attrs
import msgpack
import pytest

from shadow_proxy.channel import control

INFO = control.TapInfo(
    name="kv",
    topic="t",
    endpoint="tcp://127.0.0.1:1",
    capture="request",
    curve=False,
    filters=("strip-worker-pins",),
    models=(),
    sample=1.0,
    capacity=1024,
    transport="zmq",
    publisher_id=7,
)


class TestRoundTrip:
    """What the worker encodes, the supervisor decodes as the same value."""

    @pytest.mark.parametrize(
        "message",
        [
            control.Ready(taps=(INFO, attrs.evolve(INFO, name="js", subject="shadow.js"))),
            control.Failed("model 'm': no tokenizer.json in '/x'"),
            control.Snapshot(
                generation=3,
                families=[
                    [
                        "shadow_tap_queued",
                        "counter",
                        "doc",
                        [["shadow_tap_queued_total", {"tap": "kv"}, 3.0]],
                    ]
                ],
                taps=(control.TapCounters(next_seq=3, queued=3, dropped={"full": 0}),),
            ),
            control.Snapshot(generation=1, families=[], taps=()),
        ],
        ids=["ready", "failed", "snapshot", "final-snapshot"],
    )
    def test_round_trip(self, message: control.ControlMessage) -> None:
        assert control.decode(control.encode(message)) == message

    def test_the_wire_is_a_map_with_a_kind(self) -> None:
        raw = msgpack.unpackb(control.encode(control.Failed("x")))
        assert raw == {"kind": "error", "message": "x"}

    def test_kinds_are_distinct(self) -> None:
        kinds = [c.kind for c in (control.Ready, control.Failed, control.Snapshot)]
        assert len(set(kinds)) == 3


class TestNotAControlMessage:
    """Bytes that are not a control message raise ``ControlError`` naming no content."""

    @pytest.mark.parametrize(
        "data",
        [
            b"",
            b"\xc1",
            msgpack.packb([1, 2]),
            msgpack.packb({"message": "x"}),
            msgpack.packb({"kind": "explode"}),
            msgpack.packb({"kind": "error"}),
            msgpack.packb({"kind": "error", "message": "x", "extra": 2}),
        ],
        ids=[
            "empty",
            "invalid",
            "array",
            "no-kind",
            "unknown-kind",
            "missing-field",
            "extra-field",
        ],
    )
    def test_rejected(self, data: bytes) -> None:
        with pytest.raises(control.ControlError, match=r"^not a control message \("):
            control.decode(data)

    def test_control_error_is_a_value_error(self) -> None:
        assert issubclass(control.ControlError, ValueError)


class TestListing:
    """``/shadow/taps`` has one shape: a tap's info and its latest counters."""

    def test_info_and_counters_as_one_map(self) -> None:
        counters = control.TapCounters(next_seq=2, queued=2, queue_depth=1)
        (kv,) = control.listing([INFO], [counters])
        assert (kv["name"], kv["endpoint"], kv["next_seq"], kv["queue_depth"]) == (
            "kv",
            "tcp://127.0.0.1:1",
            2,
            1,
        )
        assert kv["filters"] == ["strip-worker-pins"] and "subject" not in kv

    def test_before_the_first_snapshot_counters_are_zero(self) -> None:
        (kv,) = control.listing([INFO], [])
        assert (kv["next_seq"], kv["dropped"]) == (0, {})


def test_drain_budget_is_positive() -> None:
    assert control.DRAIN_S > 0
