"""A shard's loop around the joiner: what it tells the main for each message (records,
losses with their reasons, which taps still wait), with the real tokenizer."""

from __future__ import annotations

import socket
import time

import pytest

from shadow_proxy.channel import frames as hf
from shadow_proxy.config import Config
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records import wire
from shadow_proxy.worker import messages as sw
from shadow_proxy.worker.shard.joiner import Joiner
from shadow_proxy.worker.shard.loop import ShardLoop, load_models

KV, REPLAY = 0, 1
SSE = (
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
BODY = b'{"model":"deepseek","messages":[{"role":"user","content":"hello"}],"max_tokens":3}'


def config(model_dirs, **worker) -> Config:
    return Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:1"},
            "models": [{"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])}],
            "worker": {"max_lag_s": 1.0, **worker},
            "taps": [
                {"name": "kv", "capture": "request", "endpoint": "ipc:///tmp/unused-kv"},
                {
                    "name": "replay",
                    "capture": "request_response",
                    "endpoint": "ipc:///tmp/unused-r",
                },
            ],
        }
    )


class Main:
    """The main's end of the shard's socket: decodes what the shard sends."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.decoder = hf.StreamDecoder()

    def read(self) -> list[list[bytes]]:
        self.sock.setblocking(False)
        messages = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return messages
            messages += [hf.split_frames(m) for m in self.decoder.feed(data)]


@pytest.fixture
def shard(model_dirs, request):
    cfg = config(model_dirs, **getattr(request, "param", {}))
    ours, theirs = socket.socketpair()
    loop = ShardLoop(cfg, Joiner(cfg, load_models(cfg)), ours, processes=1)
    yield loop, Main(theirs)
    ours.close()
    theirs.close()


def q(key: int, arrival_mono_ns: int, body: bytes = BODY) -> bytes:
    meta = hf.REQUEST_META.pack(Route.CHAT, time.time_ns(), arrival_mono_ns, 0)
    frames = [hf.KIND_REQUEST + hf.KEY.pack(key) + meta, b"rid-%d" % key, body]
    return b"".join(hf.stream_buffers(frames)[0])


def c(key: int, chunks: list[bytes], head: bool = True) -> bytes:
    index, data = hf.pack_chunks([1000] * len(chunks), chunks)
    head_frame = hf.pack_head(200, 10, "text/event-stream", "") if head else b""
    return b"".join(
        hf.stream_buffers([hf.KIND_CHUNK + hf.KEY.pack(key), head_frame, index, data])[0]
    )


def e(key: int, chunks: list[bytes] = (), head: bool = False) -> bytes:
    index, data = hf.pack_chunks([2000] * len(chunks), list(chunks))
    meta = hf.END_META.pack(EndKind.CLEAN, 5000)
    head_frame = hf.pack_head(200, 10, "text/event-stream", "") if head else b""
    frames = [hf.KIND_END + hf.KEY.pack(key) + meta, head_frame, b"", index, data]
    return b"".join(hf.stream_buffers(frames)[0])


def sent(loop: ShardLoop, main: Main) -> list[tuple]:
    """What the shard told the main, readable: ("R", tap, seq_in_payload, outcome?), ..."""
    loop.flush()
    out = []
    for frames in main.read():
        kind = frames[0][:1]
        if kind == sw.RECORD:
            tap, _, offset, payload = sw.parse_record(frames)
            envelope = wire.decode_envelope(payload)
            assert payload[offset : offset + 8] == b"\xff" * 8  # the main writes the seq there
            response = envelope.get("response")
            out.append(("R", tap, response["outcome"] if response else None))
        elif kind == sw.DROP:
            tap, count, reason = sw.parse_drop(frames)
            out.append(("D", tap, reason, count))
        elif kind == sw.SETTLE:
            _, waiting, done = sw.parse_settle(frames)
            out.append(("K", list(waiting), done))
    return out


class TestSettles:
    """After each message the main learns which taps still wait for the request."""

    def test_request_then_response(self, shard):
        loop, main = shard
        now = time.monotonic_ns()
        loop.on_message(q(1, now))
        assert sent(loop, main) == [("R", KV, None), ("K", [REPLAY], False)]
        loop.on_message(c(1, [SSE]))
        assert sent(loop, main) == []
        loop.on_message(e(1))
        assert sent(loop, main) == [("R", REPLAY, "complete"), ("K", [], True)]
        assert loop.open == {}


class TestLate:
    """Past max_lag_s: a request is not preprocessed; a response's records not built."""

    def test_late_request_dropped_on_every_tap(self, shard):
        loop, main = shard
        loop.on_message(q(2, time.monotonic_ns() - 2_000_000_000))
        assert sent(loop, main) == [("D", KV, "late", 1), ("D", REPLAY, "late", 1), ("K", [], True)]
        assert loop.late.labels("intake")._value.get() == 1

    def test_late_end_drops_joined_taps(self, shard):
        loop, main = shard
        arrival = time.monotonic_ns() - 800_000_000  # fresh at intake
        loop.on_message(q(3, arrival))
        assert sent(loop, main) == [("R", KV, None), ("K", [REPLAY], False)]
        time.sleep(0.3)
        loop.on_message(e(3, [SSE], head=True))  # ended 5 µs after arrival: now late
        assert sent(loop, main) == [("D", REPLAY, "late", 1), ("K", [], True)]


class TestFailures:
    """A failure costs the records that did not exist yet one counted drop each."""

    def test_malformed_request(self, shard):
        loop, main = shard
        frames = [hf.KIND_REQUEST + hf.KEY.pack(4) + b"short", b"rid", BODY]
        loop.on_message(b"".join(hf.stream_buffers(frames)[0]))
        assert sent(loop, main) == [
            ("D", KV, "worker_error", 1), ("D", REPLAY, "worker_error", 1), ("K", [], True),
        ]  # fmt: skip

    def test_failing_end(self, shard):
        loop, main = shard
        loop.on_message(q(5, time.monotonic_ns()))
        sent(loop, main)
        bad = [hf.KIND_END + hf.KEY.pack(5) + hf.END_META.pack(EndKind.CLEAN, 9), b"", b"", b"x"]
        loop.on_message(b"".join(hf.stream_buffers(bad)[0]))  # no chunk frame: IndexError
        assert sent(loop, main) == [("D", REPLAY, "worker_error", 1), ("K", [], True)]


@pytest.mark.parametrize("shard", [{"max_request_cpu_s": 0.001}], indirect=True)
class TestCpuBudget:
    """Past max_request_cpu_s the response is read no further; the record says why."""

    def test_gives_up_and_records_what_was_read(self, shard):
        loop, main = shard
        loop.on_message(q(6, time.monotonic_ns()))
        sent(loop, main)
        loop.open[hf.KEY.pack(6)] = 0.01  # as if its messages had cost 10 ms
        loop.on_message(c(6, [SSE]))
        loop.on_message(e(6))
        assert sent(loop, main) == [("R", REPLAY, "incomplete"), ("K", [], True)]
        assert loop.budget_exceeded.labels("cpu")._value.get() == 1

    def test_a_response_that_comes_whole_with_its_end(self, shard):
        """A short response travels in the end message alone (no chunk message set a
        deadline before): its decoding is held to the budget all the same."""
        loop, main = shard
        loop.on_message(q(7, time.monotonic_ns()))
        sent(loop, main)
        loop.open[hf.KEY.pack(7)] = 0.01
        loop.on_message(e(7, [SSE], head=True))
        assert sent(loop, main) == [("R", REPLAY, "incomplete"), ("K", [], True)]
        assert loop.budget_exceeded.labels("cpu")._value.get() == 1
