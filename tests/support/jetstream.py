"""The JetStream publisher fed without a proxy, synthetic records, and a tap's
records read back from the stream: shared by the JetStream unit and
integration tests."""

from __future__ import annotations

import time
from typing import Any

from shadow_proxy.config import Config
from shadow_proxy.records.envelope import build_envelope
from shadow_proxy.records.wire import decode_envelope, encode_envelope
from shadow_proxy.worker.main.publishers.jetstream import JetStreamLink
from shadow_proxy.worker.main.tap_queue import TapQueue
from tests.support.nats import stream_records

MODEL = "deepseek"


def nats_section(servers: list[str], **extra: Any) -> dict[str, Any]:
    return {"servers": servers, "max_bytes": 256 * 2**20, **extra}


def synthetic_payload(tap: str, seq: int, tokens: int = 8) -> bytes:
    return encode_envelope(
        build_envelope(
            tap=tap,
            seq=seq,
            request_id=f"req-{seq}",
            origin="completions",
            filters=["strip-worker-pins"],
            arrival_unix_ns=time.time_ns(),
            sample_rate=1.0,
            request={"model": MODEL, "token_ids": list(range(seq % 7, seq % 7 + tokens))},
            response=None,
        )
    )


class DirectPublisher:
    """The real JetStream link and publisher, fed without a proxy (same thread
    discipline: ``offer``/``pump`` here play the worker's loop)."""

    def __init__(self, servers: list[str], tap: str = "direct", capacity: int = 1024, **nats):
        config = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:9"},
                "nats": nats_section(servers, **nats),
                "taps": [
                    {"name": tap, "capture": "request", "transport": "nats", "capacity": capacity}
                ],
            }
        )
        self.tap = config.taps[0]
        self.link = JetStreamLink(config.nats)
        self.queue = TapQueue(self.tap)
        self.publisher = self.link.publisher(self.queue)
        self.link.start()

    def startup_problem(self, budget_s: float = 5.0) -> str | None:
        return self.link.startup_problem(budget_s)

    def offer(self, count: int) -> None:
        for _ in range(count):
            seq = self.queue.take_seq()
            self.queue.offer(synthetic_payload(self.tap.name, seq), seq=seq)
            self.publisher.pump()

    def pump(self) -> None:
        self.publisher.pump()

    def close(self) -> None:
        self.publisher.close()


async def tap_messages(servers: list[str], subject: str, stream: str = "SHADOW") -> list:
    """The records (not heartbeats) one subject holds in the stream."""
    return [m for m in await stream_records(servers, stream) if m.subject == subject]


def envelopes(messages: list) -> list[dict[str, Any]]:
    return [decode_envelope(m.data) for m in messages]


def nats_tap_config(servers: list[str], capacity: int = 4) -> Config:
    """One ``nats`` tap named ``t`` and the servers it publishes to."""
    return Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:9"},
            "nats": {"servers": servers},
            "taps": [
                {"name": "t", "capture": "request", "transport": "nats", "capacity": capacity}
            ],
        }
    )


def offer_records(publisher: Any, count: int) -> None:
    """``count`` synthetic records on the publisher's queue, each with its seq."""
    for _ in range(count):
        seq = publisher.queue.take_seq()
        publisher.queue.offer(synthetic_payload(publisher.queue.name, seq), seq=seq)
