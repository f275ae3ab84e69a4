"""The worker main's own part of the loop: the hello of the hand-off (what dead
predecessors left to announce), routing to the pool, the serving loop's last
message, and the serving process going away. (The main with its shards, for real:
tests/integration/test_worker_pool.py.)"""

from __future__ import annotations

import socket
import threading

import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel.handoff import KEY, Hello, Last, Request
from shadow_proxy.channel.stream import stream_message
from shadow_proxy.config import Config
from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.exchange import Route
from shadow_proxy.worker.main.loop import Main
from shadow_proxy.worker.main.publishing import Publishing


class RoutedTo:
    """Stands for the pool: keeps what the main routes to it."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def route(self, message: bytes) -> None:
        self.messages.append(message)


def serving_side(path: str, *messages: bytes) -> threading.Thread:
    """Accepts the main's connection, writes ``messages``, then closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"".join(messages))
        conn.close()
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def main_for(context: zmq.Context) -> tuple[Main, RoutedTo]:
    config = Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:1"},
            "taps": [{"name": "kv", "capture": "request", "endpoint": reserve_endpoint()}],
        }
    )
    registry = CollectorRegistry()
    publishing = Publishing(config, context, registry)
    pool = RoutedTo()
    return Main(config, publishing, pool, registry), pool  # type: ignore[arg-type]


class TestHandoff:
    def test_hello_then_messages_then_the_last(self, tmp_path) -> None:
        context = zmq.Context()
        main, pool = main_for(context)
        dead = cp.TapState(name="kv", publisher_id=5, next_seq=9, dropped={"worker_died": 2})
        hello = stream_message(Hello(3, 4, (dead,)).encode())
        q = stream_message(Request(KEY.pack(1), Route.CHAT, 1, 2, 0, "rid", b"{}").encode())
        path = str(tmp_path / "h")
        thread = serving_side(path, hello, q, stream_message(Last().encode()))
        try:
            main.connect(path)
            assert main.publishing.lost_seen == 4  # counted by the dead worker's final state
            assert [beat.publisher_id for _, beat, _ in main.publishing._tombstones] == [5]
            while not main.last_seen:
                main.handoff.setblocking(True)
                main.read_handoff()
            assert pool.messages == [q]
            assert not main.parent_gone
        finally:
            thread.join(5)
            main.handoff.close()
            main.publishing.close()
            context.term()

    def test_the_serving_process_going_away(self, tmp_path) -> None:
        context = zmq.Context()
        main, _ = main_for(context)
        path = str(tmp_path / "h")
        thread = serving_side(path, stream_message(Hello(1, 0).encode()))
        try:
            main.connect(path)
            thread.join(5)
            main.handoff.setblocking(True)
            main.read_handoff()
            assert main.parent_gone and not main.last_seen
        finally:
            main.handoff.close()
            main.publishing.close()
            context.term()
