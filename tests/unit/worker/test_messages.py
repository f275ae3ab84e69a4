"""Messages between the worker's main and its shards: what one side encodes, the
other decodes to the same message; frames that are not one are refused."""

from __future__ import annotations

import pytest

from shadow_proxy.channel.handoff import KEY, End, Request
from shadow_proxy.channel.stream import split_frames, stream_message
from shadow_proxy.exchange import DropReason, EndKind, Route
from shadow_proxy.worker import messages
from shadow_proxy.worker.sink import EncodedRecord


def round_trip(message: messages.ShardMessage) -> messages.ShardMessage:
    return messages.decode(split_frames(stream_message(message.encode())))


class TestRoundTrip:
    """Every message a shard sends comes back as itself."""

    @pytest.mark.parametrize(
        "message",
        [
            messages.Hello(7, 1234),
            messages.Ready(99, "idle"),
            messages.Ready(99, "nice", "SCHED_IDLE refused"),
            messages.Failed("no tokenizer"),
            messages.Record(3, 99, EncodedRecord(b"\x83\xa3seq", b"\xa3tap\xa2kv")),
            messages.Drop(2, DropReason.WORKER_DIED, 5),
            messages.Skip(1, "sample"),
            # A batch owes one record per prompt: a tap repeats.
            messages.Settle(KEY.pack(9), (1, 1, 0), False),
            messages.Settle(KEY.pack(9), (), True),
            messages.Metrics([["x", "counter", "doc", [["x_total", {}, 1.0]]]]),
            messages.Retire(2048),
        ],
        ids=lambda m: type(m).__name__,
    )
    def test_from_a_shard(self, message: messages.ShardMessage) -> None:
        assert round_trip(message) == message

    def test_to_a_shard(self) -> None:
        exit_frames = split_frames(stream_message(messages.Exit().encode()))
        assert messages.decode_for_shard(exit_frames) == messages.Exit()
        request = Request(KEY.pack(1), Route.CHAT, 1, 2, 0, "rid", b"{}")
        assert messages.decode_for_shard(request.encode()) == request
        end = End(KEY.pack(1), EndKind.CLEAN, 3)
        assert messages.decode_for_shard(end.encode()) == end


class TestRefused:
    """Frames of another protocol, or cut short, are ``MessageError``."""

    def test_unknown_and_short(self) -> None:
        with pytest.raises(messages.MessageError):
            messages.decode([b"?"])
        with pytest.raises(messages.MessageError):
            messages.decode([b"R" + b"\x00"])
        with pytest.raises(messages.MessageError):
            messages.decode([b"D" + b"\x00" * 10, b"not a reason"])
