"""Record messages, record files and a reader's collection, for the source tests."""

from __future__ import annotations

from pathlib import Path

from shadow_proxy.records import files, sources, wire
from shadow_proxy.records.envelope import build_envelope

TOPIC = "shadow-requests-kv"


def payload(seq: int, tap: str = "kv", **overrides) -> bytes:
    envelope = build_envelope(
        tap=tap,
        seq=seq,
        request_id=f"r{seq}",
        origin="chat",
        filters=[],
        arrival_unix_ns=1,
        sample_rate=1.0,
        request={"token_ids": [1]},
        response=None,
    )
    envelope.update(overrides)
    return wire.encode_envelope(envelope)


def record(seq: int, publisher: int = 1, tap: str = "kv", **overrides) -> wire.Message:
    return wire.Message(TOPIC, publisher, seq, 0, payload(seq, tap, **overrides))


def heartbeat(publisher: int = 1, next_seq: int = 3) -> wire.Message:
    beat = wire.Heartbeat("kv", publisher, next_seq, next_seq - 1).encode()
    return wire.Message(wire.heartbeat_topic(TOPIC), publisher, 0, 0, beat)


def write(path: Path, *entries: wire.Message | bytes) -> Path:
    with path.open("wb") as f:
        for entry in entries:
            f.write(files.encode_entry(entry) if isinstance(entry, wire.Message) else entry)
    return path


async def collect(source: sources.RecordSource) -> list[sources.Delivery]:
    found = [delivery async for delivery in source]
    await source.aclose()
    return found
