"""The consumer's accounting without sockets: totals, gaps, tail loss, undecodable input."""

from __future__ import annotations

import pytest

from shadow_proxy.consumer.accounting import (
    ERROR_CHARS,
    MAX_ERROR_MESSAGES,
    OTHER_ERRORS,
    Accounts,
)
from shadow_proxy.records import wire
from tests.support.tap_messages import TOPIC, heartbeat_frames, record_frames


def feed(accounts: Accounts, seqs, now: float = 0.0, **kwargs) -> None:
    for seq in seqs:
        accounts.on_frames(record_frames(seq, **kwargs), now)


class TestAccounts:
    """Per publisher totals: gaps, late joins, duplicates, restarts and tail loss."""

    def test_totals(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1], tokens=5)
        accounts.on_frames(
            record_frames(2, response={"outcome": "complete", "output_tokens": 7}), 0
        )
        accounts.on_frames(
            record_frames(3, response={"outcome": "cancelled", "output_tokens": 2}), 0
        )
        summary = accounts.summary(0)
        assert summary["records"] == 4
        assert summary["prompt_tokens"] == 5 + 5 + 3 + 3
        assert summary["output_tokens"] == 9
        assert summary["outcomes"] == {"cancelled": 1, "complete": 1}
        assert summary["tap_gaps"] == summary["transport_gaps"] == 0

    def test_errors_by_message(self):
        """Error records are counted by what they say (the record's message, else
        its status), most frequent first; other outcomes are not."""
        accounts = Accounts(TOPIC)
        responses = [
            {"outcome": "error", "error": "upstream connection broke", "http_status": 200},
            {"outcome": "error", "http_status": 503},
            {"outcome": "error", "error": "upstream connection broke"},
            {"outcome": "error"},
            {"outcome": "cancelled", "error": "not an error record"},
        ]
        for seq, response in enumerate(responses):
            accounts.on_frames(record_frames(seq, response=response), 0)
        summary = accounts.summary(0)
        assert summary["errors"] == {
            "upstream connection broke": 2,
            "(no message)": 1,
            "HTTP 503": 1,
        }
        assert summary["publishers"][0]["errors"] == summary["errors"]

    def test_error_messages_are_bounded(self):
        """At most MAX_ERROR_MESSAGES distinct messages, each clipped; the rest
        are counted, not lost."""
        accounts = Accounts(TOPIC)
        n = MAX_ERROR_MESSAGES + 5
        for seq in range(n):
            long = f"error {seq:03d} " + "x" * 1000
            response = {"outcome": "error", "error": long}
            accounts.on_frames(record_frames(seq, response=response), 0)
        errors = accounts.summary(0)["errors"]
        assert errors[OTHER_ERRORS] == 5
        assert len(errors) == MAX_ERROR_MESSAGES + 1
        assert sum(errors.values()) == n
        assert all(len(message) <= ERROR_CHARS for message in errors)

    def test_out_of_order_arrival_is_not_a_gap(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 2, 1, 3])
        assert accounts.summary(0)["tap_gaps"] == 0

    def test_tap_drop_is_a_tap_gap_not_a_transport_gap(self):
        accounts = Accounts(TOPIC)
        for transport, seq in enumerate([0, 1, 3, 4]):  # seq 2 dropped in the tap
            accounts.on_frames(record_frames(seq, transport=transport), 0)
        summary = accounts.summary(0)
        assert (summary["tap_gaps"], summary["transport_gaps"]) == (1, 0)

    def test_transport_loss(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1, 4])
        summary = accounts.summary(0)
        assert (summary["tap_gaps"], summary["transport_gaps"]) == (2, 2)

    def test_late_join_is_not_a_gap(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [1000, 1001, 1002])
        summary = accounts.summary(0)
        assert summary["tap_gaps"] == 0
        assert summary["publishers"][0]["first_seq"] == 1000

    def test_duplicates_are_counted_once(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1, 1, 2])
        summary = accounts.summary(0)
        assert summary["records"] == 3
        assert summary["prompt_tokens"] == 9
        assert summary["duplicates"] == 1

    def test_publisher_restart_starts_fresh(self):
        accounts = Accounts(TOPIC)
        feed(accounts, range(5), publisher=1)
        feed(accounts, range(3), publisher=2)  # a new process: seq from 0 again
        summary = accounts.summary(0)
        assert summary["records"] == 8
        assert summary["duplicates"] == summary["tap_gaps"] == 0
        by_id = {p["publisher_id"]: p for p in summary["publishers"]}
        assert (by_id[1]["records"], by_id[2]["records"]) == (5, 3)

    def test_tail_loss_after_grace(self):
        accounts = Accounts(TOPIC, grace=2.0)
        feed(accounts, range(5))  # transport 0..4
        accounts.on_frames(heartbeat_frames(next_seq=8, last_transport=6), now=10.0)
        assert accounts.summary(11.0)["tail_loss"] == 0  # may still be on the way
        summary = accounts.summary(12.0)
        assert summary["tail_loss"] == 3  # seq 5, 6, 7
        assert summary["transport_tail_loss"] == 2  # transport 5, 6
        assert summary["tap_gaps"] == 0
        assert summary["heartbeats"] == 1
        assert summary["publishers"][0]["last_heartbeat"]["dropped"] == {"full": 1}
        feed(accounts, [5], now=13.0)  # a straggler
        assert accounts.summary(13.0)["tail_loss"] == 2

    def test_heartbeat_before_any_record_starts_the_range(self):
        accounts = Accounts(TOPIC, grace=0.0)
        accounts.on_frames(heartbeat_frames(next_seq=10, last_transport=9), 0)
        assert accounts.summary(1)["tail_loss"] == 0
        accounts.on_frames(heartbeat_frames(next_seq=12, last_transport=11, beat=1), 1)
        assert accounts.summary(2)["tail_loss"] == 2  # nothing arrived at all
        feed(accounts, [12, 13], now=2)
        assert accounts.summary(2)["tap_gaps"] == 2  # 10 and 11 never came

    def test_heartbeats_do_not_take_transport_sequences(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0])
        accounts.on_frames(heartbeat_frames(next_seq=1, last_transport=0), 0)
        feed(accounts, [1])
        assert accounts.summary(10)["transport_gaps"] == 0


class TestUndecodable:
    """Bad messages are counted by reason; none is fatal."""

    @pytest.mark.parametrize(
        ("frames", "reason"),
        [
            ([TOPIC.encode()], "frames"),
            ([TOPIC.encode(), b"x", b"y", b"z"], "frames"),
            ([*record_frames(0)[:3], b"\x09\x00\x00\x00\x00"], "header"),
            (record_frames(0, topic=TOPIC + "b"), "topic"),  # a sibling topic, prefix match
            (record_frames(0, topic="shadow"), "topic"),
            (wire.encode_frames(TOPIC, 1, 0, 0, b"\x93\x01\x02\x03"), "envelope"),
            (record_frames(0, schema_version=2), "schema"),
            (record_frames(0, request={"model": "m", "token_ids": "12"}), "record"),
            (record_frames(0, tap=5), "record"),
            (wire.encode_frames(wire.heartbeat_topic(TOPIC), 1, 0, 0, b"\x80"), "heartbeat"),
        ],
    )
    def test_counted(self, frames, reason):
        accounts = Accounts(TOPIC)
        assert accounts.on_frames(frames, 0) is None
        summary = accounts.summary(0)
        assert summary["undecodable"] == {reason: 1}
        assert summary["records"] == 0

    def test_missing_field(self):
        envelope = {"schema_version": 1, "seq": 0}
        frames = wire.encode_frames(TOPIC, 1, 0, 0, wire.encode_envelope(envelope))
        accounts = Accounts(TOPIC)
        accounts.on_frames(frames, 0)
        assert accounts.undecodable == {"record": 1}
