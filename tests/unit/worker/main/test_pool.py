"""The pool as the worker's main sees it, with the shards' ends played by sockets:
routing by key, a request's messages following it, the per-shard bound, lag at
intake, settles, and a shard's death costing exactly the records still owed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import zlib

import pytest
import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel.handoff import KEY, Chunks, End, Pieces, Request, peek
from shadow_proxy.channel.stream import StreamDecoder, split_frames, stream_message
from shadow_proxy.config import Config
from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker import messages
from shadow_proxy.worker.main.pool import Pool
from shadow_proxy.worker.main.publishing import Publishing
from shadow_proxy.worker.main.shards import Shard

KV, REPLAY = 0, 1
BOUND = 100_000


class ShardEnd:
    """The shard's end of its socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(0.2)
        self.decoder = StreamDecoder()

    def received(self) -> list[bytes]:
        out = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return out
            if not data:
                return out
            out += self.decoder.feed(data)

    def send(self, *sent: messages.ShardMessage) -> None:
        self.sock.sendall(b"".join(stream_message(m.encode()) for m in sent))


@pytest.fixture
def pool(tmp_path):
    config = Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:1"},
            "worker": {"processes": 2, "handoff_max_bytes": BOUND, "max_lag_s": 1.0},
            "taps": [
                {"name": "kv", "capture": "request", "endpoint": reserve_endpoint()},
                {"name": "replay", "capture": "request_response", "endpoint": reserve_endpoint()},
            ],
        }
    )
    context = zmq.Context()
    registry = CollectorRegistry()
    publishing = Publishing(config, context, registry)
    pool = Pool(config, publishing, str(tmp_path), registry, processes=2)
    ends, processes = [], []
    for index in range(2):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        processes.append(process)
        shard = Shard(index, index + 1, process, time.monotonic(), sock=ours, ready=True)
        pool.shards[shard.token] = shard
        pool.slots[index] = shard
        pool.by_fd[ours.fileno()] = shard
        ends.append(ShardEnd(theirs))
    pool.stopping = True  # nothing is started again in these tests
    yield pool, publishing, ends
    for process in processes:
        process.kill()
        process.wait()
    for end in ends:
        end.sock.close()
    for shard in list(pool.by_fd.values()):
        shard.sock.close()
    pool.listener.close()
    publishing.close()
    context.term()


def q(
    key: int, body: bytes = b"{}", age_s: float = 0.0, lost_before: int = 0, headers: bytes = b""
) -> bytes:
    arrival = time.monotonic_ns() - int(age_s * 1e9)
    request = Request(
        KEY.pack(key), Route.CHAT, time.time_ns(), arrival, lost_before, "rid", body, headers
    )
    return stream_message(request.encode())


def c(key: int, data: bytes = b"data: x\n\n") -> bytes:
    return stream_message(Chunks(KEY.pack(key), None, [1], Pieces.of([data])).encode())


def e(key: int) -> bytes:
    return stream_message(End(KEY.pack(key), EndKind.CLEAN, 5).encode())


def kinds(received: list[bytes]) -> list[tuple[bytes, int]]:
    return [(peek(m)[0], KEY.unpack(peek(m)[1])[0]) for m in received]


def dropped(publishing: Publishing, tap: int, reason: str) -> int:
    return publishing.queues[tap].dropped[reason]


class TestRouting:
    """A request goes to a ready shard by its key; its chunks and end follow it."""

    def test_by_key_and_following(self, pool) -> None:
        p, _, (zero, one) = pool
        for message in (q(10), q(11), c(10), e(11), e(10), c(99)):
            p.route(message)
        p.flush()
        got = {0: kinds(zero.received()), 1: kinds(one.received())}
        assert got == {0: [(b"q", 10), (b"c", 10), (b"e", 10)], 1: [(b"q", 11), (b"e", 11)]}

    def test_a_conversation_stays_on_one_shard(self, pool) -> None:
        """Requests naming a session go where their session hashes, whatever
        their keys (the turns meet their segments in one cache); the others
        by key."""
        p, _, (zero, one) = pool
        ends = {0: zero, 1: one}
        sessions = {b"conv-a": zlib.crc32(b"conv-a") % 2, b"conv-d": zlib.crc32(b"conv-d") % 2}
        assert set(sessions.values()) == {0, 1}, "pick sessions that land on both shards"
        expected: dict[int, list[tuple[bytes, int]]] = {0: [], 1: []}
        for key in range(20, 30):
            session = (b"conv-a", b"conv-d")[key % 2]
            header = b"x-tenant-id:t\nx-dynamo-session-id:" + session + b"\n"
            p.route(q(key, body=b"x" * (key * 97), headers=header))
            expected[sessions[session]].append((b"q", key))
        p.route(q(31))  # no session: by key
        expected[31 % 2].append((b"q", 31))
        p.flush()
        assert {i: kinds(end.received()) for i, end in ends.items()} == expected

    def test_lost_before_counted_once_per_tap(self, pool) -> None:
        p, publishing, _ = pool
        p.route(q(1, lost_before=3))
        p.route(q(2, lost_before=3))
        assert (
            dropped(publishing, KV, "handoff_full")
            == dropped(publishing, REPLAY, "handoff_full")
            == 3
        )
        assert publishing.resolved == [0, 0]  # never handed over on this connection


class TestBoundsAndLag:
    def test_a_full_shard_pipe_drops_the_request_on_every_tap(self, pool) -> None:
        p, publishing, _ = pool
        p.route(q(0, body=b"x" * (BOUND // 2 + 1)))  # over this shard's half
        assert (
            dropped(publishing, KV, "handoff_full")
            == dropped(publishing, REPLAY, "handoff_full")
            == 1
        )
        assert publishing.resolved == [1, 1] and p.open == {}

    def test_a_dropped_chunk_makes_the_end_a_lost_capture(self, pool) -> None:
        p, _, (zero, _) = pool
        p.route(q(0))
        p.route(c(0, b"y" * (BOUND // 2 + 1)))
        p.route(c(0))  # not forwarded either: the copy is no longer whole
        p.route(e(0))
        p.flush()
        received = zero.received()
        assert kinds(received) == [(b"q", 0), (b"e", 0)]
        assert End.decode(split_frames(received[1])) == End.lost(KEY.pack(0), 5)

    def test_late_at_intake(self, pool) -> None:
        p, publishing, (zero, _) = pool
        p.route(q(0, age_s=2.0))
        p.flush()
        assert zero.received() == []
        assert dropped(publishing, KV, "late") == dropped(publishing, REPLAY, "late") == 1


class TestSettlesAndDeath:
    """A shard's death costs the records its open requests still owe: no more, no less."""

    def test_death_counts_what_is_owed(self, pool) -> None:
        p, publishing, (zero, _) = pool
        for key in (0, 2, 4):  # all to shard 0
            p.route(q(key))
        p.flush()
        zero.received()
        # Request 0: kv's record done, replay's owed. Request 2: a batch of 3 prompts
        # owing replay 3 records. Request 4: never settled (every tap owed once).
        zero.send(
            messages.Settle(KEY.pack(0), (REPLAY,), False),
            messages.Settle(KEY.pack(2), (REPLAY,) * 3, False),
        )
        shard = p.slots[0]
        fd = shard.sock.fileno()
        deadline = time.monotonic() + 5
        while publishing.resolved != [2, 0] and time.monotonic() < deadline:
            p.readable(fd)
        assert publishing.resolved == [2, 0]
        shard.process.kill()  # the shard dies: its process, then its socket
        zero.sock.close()
        p.readable(fd)
        assert dropped(publishing, REPLAY, "closed") == 1 + 3 + 1  # stopping: closed
        assert dropped(publishing, KV, "closed") == 1
        assert publishing.resolved == [3, 3]
        assert p.open == {} and p.slots[0] is None
