"""A shard's loop around the joiner: what it tells the main for each message (records,
losses with their reasons, which taps still wait), with the real tokenizer."""

from __future__ import annotations

import socket
import time

import pytest

from shadow_proxy.channel.handoff import KEY, Chunks, End, Head, Pieces, Request
from shadow_proxy.channel.stream import StreamDecoder, split_frames, stream_message
from shadow_proxy.config import Config
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records import wire
from shadow_proxy.worker import messages
from shadow_proxy.worker.shard.joiner import Joiner
from shadow_proxy.worker.shard.loop import ShardLoop, guarded
from shadow_proxy.worker.shard.metrics import JoinerMetrics
from shadow_proxy.worker.shard.models import load_models
from shadow_proxy.worker.shard.outbox import Outbox

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
        self.decoder = StreamDecoder()

    def read(self) -> list[messages.ShardMessage]:
        self.sock.setblocking(False)
        got = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return got
            got += [messages.decode(split_frames(m)) for m in self.decoder.feed(data)]


@pytest.fixture
def shard(model_dirs, request):
    cfg = config(model_dirs, **getattr(request, "param", {}))
    ours, theirs = socket.socketpair()
    outbox = Outbox(ours)
    loop = ShardLoop(cfg, Joiner(cfg, load_models(cfg), outbox), outbox)
    yield loop, Main(theirs)
    ours.close()
    theirs.close()


def q(key: int, arrival_mono_ns: int, body: bytes = BODY) -> bytes:
    request = Request(
        KEY.pack(key), Route.CHAT, time.time_ns(), arrival_mono_ns, 0, f"rid-{key}", body
    )
    return stream_message(request.encode())


HEAD = Head(200, 10, "text/event-stream", "")


def c(key: int, chunks: list[bytes], head: bool = True) -> bytes:
    message = Chunks(KEY.pack(key), HEAD if head else None, [1000] * len(chunks), Pieces.of(chunks))
    return stream_message(message.encode())


def e(key: int, chunks: list[bytes] = (), head: bool = False) -> bytes:
    data = list(chunks)
    message = End(
        KEY.pack(key),
        EndKind.CLEAN,
        5000,
        HEAD if head else None,
        "",
        [2000] * len(data),
        Pieces.of(data),
    )
    return stream_message(message.encode())


def sent(loop: ShardLoop, main: Main) -> list[tuple]:
    """What the shard told the main, readable: ("R", tap, outcome?), ("D", ...), ("K", ...)."""
    loop.outbox.flush()
    out: list[tuple] = []
    for message in main.read():
        match message:
            case messages.Record(tap=tap, record=record):
                envelope = wire.decode_envelope(record.with_seq(0))
                response = envelope.get("response")
                out.append(("R", tap, response["outcome"] if response else None))
            case messages.Drop(tap=tap, reason=reason, count=count):
                out.append(("D", tap, reason, count))
            case messages.Settle(waiting=waiting, done=done):
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


class TestIdleReport:
    """An idle shard reports its metrics right after what it counted (records, drops,
    skips), not after a message that sent none."""

    @staticmethod
    def reports(loop: ShardLoop, main: Main) -> int:
        loop.idle()
        loop.outbox.flush()
        return sum(isinstance(m, messages.Metrics) for m in main.read())

    def test_after_records_only(self, shard):
        loop, main = shard
        loop.on_message(q(1, time.monotonic_ns()))
        assert self.reports(loop, main) == 1
        loop.on_message(c(1, [SSE]))
        assert self.reports(loop, main) == 0
        loop.on_message(e(1))
        assert self.reports(loop, main) == 1
        assert self.reports(loop, main) == 0


class TestLate:
    """Past max_lag_s: a request is not preprocessed; a response's records not built."""

    def test_late_request_dropped_on_every_tap(self, shard):
        loop, main = shard
        loop.on_message(q(2, time.monotonic_ns() - 2_000_000_000))
        assert sent(loop, main) == [("D", KV, "late", 1), ("D", REPLAY, "late", 1), ("K", [], True)]
        assert loop.late.labels("intake").value == 1

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
        frames = [b"q" + KEY.pack(4) + b"short", b"rid", BODY]
        loop.on_message(stream_message(frames))
        assert sent(loop, main) == [
            ("D", KV, "worker_error", 1),
            ("D", REPLAY, "worker_error", 1),
            ("K", [], True),
        ]

    def test_failing_end(self, shard):
        loop, main = shard
        loop.on_message(q(5, time.monotonic_ns()))
        sent(loop, main)
        bad = End(KEY.pack(5), EndKind.CLEAN, 9).encode()[:4]
        loop.on_message(stream_message(bad))  # no chunk frame: it does not decode
        assert sent(loop, main) == [("D", REPLAY, "worker_error", 1), ("K", [], True)]


@pytest.mark.parametrize("shard", [{"max_request_cpu_s": 0.001}], indirect=True)
class TestCpuBudget:
    """Past max_request_cpu_s the response is read no further; the record says why."""

    def test_gives_up_and_records_what_was_read(self, shard):
        loop, main = shard
        loop.on_message(q(6, time.monotonic_ns()))
        sent(loop, main)
        loop.open[KEY.pack(6)] = 0.01  # as if its messages had cost 10 ms
        loop.on_message(c(6, [SSE]))
        loop.on_message(e(6))
        assert sent(loop, main) == [("R", REPLAY, "incomplete"), ("K", [], True)]
        assert loop.budget_exceeded.labels("cpu").value == 1

    def test_a_response_that_comes_whole_with_its_end(self, shard):
        """A short response travels in the end message alone (no chunk message set a
        deadline before): its decoding is held to the budget all the same."""
        loop, main = shard
        loop.on_message(q(7, time.monotonic_ns()))
        sent(loop, main)
        loop.open[KEY.pack(7)] = 0.01
        loop.on_message(e(7, [SSE], head=True))
        assert sent(loop, main) == [("R", REPLAY, "incomplete"), ("K", [], True)]
        assert loop.budget_exceeded.labels("cpu").value == 1


class TestGuard:
    """A failure is counted by exception type and logged without its message."""

    def test_malformed_message_costs_it_alone(self, caplog) -> None:
        metrics = JoinerMetrics()
        secret = "sk-secret-in-a-body"

        def fail() -> None:
            raise ValueError(f"unpack requires a buffer: {secret}")

        assert guarded(metrics, fail) is False
        failures = metrics.tally.get_sample_value(
            "shadow_worker_failures_total", {"exception": "ValueError"}
        )
        assert failures == 1
        assert "hand-off message dropped: ValueError at" in caplog.text
        assert "sk-secret" not in caplog.text
        assert "unpack requires" not in caplog.text, "the exception's message is logged"
        assert guarded(metrics, lambda: None) is True
