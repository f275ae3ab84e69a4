"""Records from a JetStream stream, read with a durable pull consumer (SPEC 8 and 9).

``JetStreamSource`` is an async iterator of ``StreamRecord`` (the decoded
envelope with its ``(publisher_id, tap, seq)``). Nothing is acknowledged by
the source: the caller handles a record (counts it, writes it, replays it) and
then calls ``ack``; a record not acknowledged within the consumer's
``ack_wait`` is delivered again, to this process or to another one sharing the
durable. So a reader that dies loses nothing, and a restarted one resumes at
the durable's position. Several processes on one durable split the records:
the way to scale a reader out.

Delivery is at least once; counting each ``(publisher_id, tap, seq)`` once is
the caller's part (``consumer.Accounts`` does it), so a redelivery is never
counted twice in one process.

The durable consumer filters the tap's subject and its heartbeat subject
(``{subject}.heartbeat``). Heartbeats are handed to ``on_heartbeat`` and
acknowledged by the source. A message that is not a record of this tap (bad
headers, not MessagePack, another tap's name) is counted in ``rejected`` by
a fixed reason word, acknowledged so that it is not delivered again, and
skipped: never fatal.

The subject of a tap is the one the proxy uses: ``shadow.{topic}``, the
topic defaulting to ``shadow-requests-{tap}`` (pass ``subject`` when the tap
names its own).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from shadow_proxy.records import missing_fields
from shadow_proxy.wire import HEARTBEAT_SUFFIX, Heartbeat, WireError, decode_envelope

log = logging.getLogger(__name__)

DEFAULT_STREAM = "SHADOW"
#: How long a delivered record may stay unacknowledged before it is delivered
#: again (JetStream's default): longer than handling one batch takes.
DEFAULT_ACK_WAIT_S = 30.0
DEFAULT_BATCH = 256
#: At most this many records delivered and not acknowledged, per durable.
MAX_ACK_PENDING = 4096


class SourceError(RuntimeError):
    """The stream or the durable cannot be read as asked; the message says why."""


def default_subject(tap: str, topic: str | None = None) -> str:
    """The subject a tap publishes to when its configuration names none."""
    return f"shadow.{topic or f'shadow-requests-{tap}'}"


@attrs.frozen
class StreamRecord:
    """One record read from the stream; ``ack`` it once handled."""

    publisher_id: int
    tap: str
    seq: int
    envelope: dict[str, Any]
    #: The envelope's MessagePack, as published (for record files).
    payload: bytes
    stream_sequence: int
    #: 1 on the first delivery, more on a redelivery.
    deliveries: int
    message: Msg = attrs.field(eq=False, repr=False)


@attrs.define
class JetStreamSource:
    """A durable pull consumer on one tap's subject; ``async with`` opens it."""

    servers: Sequence[str]
    tap: str
    durable: str
    stream: str = DEFAULT_STREAM
    subject: str | None = None
    ack_wait_s: float = DEFAULT_ACK_WAIT_S
    batch: int = DEFAULT_BATCH
    on_heartbeat: Callable[[Heartbeat], None] | None = None
    rejected: dict[str, int] = attrs.field(factory=dict)
    _nc: Any = None
    _sub: Any = None
    _ready: collections.deque[StreamRecord] = attrs.field(factory=collections.deque)

    @property
    def filter_subjects(self) -> list[str]:
        subject = self.subject or default_subject(self.tap)
        return [subject, subject + HEARTBEAT_SUFFIX]

    async def __aenter__(self) -> JetStreamSource:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        self._nc = await nats.connect(
            servers=list(self.servers),
            name=f"shadow-consumer {self.durable}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
        )
        js = self._nc.jetstream()
        config = api.ConsumerConfig(
            durable_name=self.durable,
            filter_subjects=self.filter_subjects,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=MAX_ACK_PENDING,
        )
        try:
            self._sub = await js.pull_subscribe(
                None, durable=self.durable, stream=self.stream, config=config
            )
            info = await self._sub.consumer_info()
        except nats.js.errors.NotFoundError as e:
            await self.close()
            msg = f"no JetStream stream {self.stream!r} at {', '.join(self.servers)}"
            raise SourceError(msg) from e
        found = info.config.filter_subjects or [info.config.filter_subject]
        if sorted(filter(None, found)) != sorted(self.filter_subjects):
            await self.close()
            msg = (
                f"durable {self.durable!r} of stream {self.stream!r} reads {found}, not "
                f"{self.filter_subjects}: choose another --durable for this tap"
            )
            raise SourceError(msg)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    def __aiter__(self) -> JetStreamSource:
        return self

    async def __anext__(self) -> StreamRecord:
        while not self._ready:
            self._ready.extend(await self.fetch(5.0))
        return self._ready.popleft()

    async def fetch(self, timeout: float) -> list[StreamRecord]:
        """The records delivered within ``timeout`` (at most ``batch``; maybe none)."""
        try:
            messages = await self._sub.fetch(self.batch, timeout=timeout)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        records = []
        for message in messages:
            record = self._decode(message)
            if record is None:
                await message.ack()
            else:
                records.append(record)
        return records

    async def ack(self, records: Sequence[StreamRecord]) -> None:
        """Acknowledge handled records; returns once the acks left for the server."""
        for record in records:
            await record.message.ack()
        await self._nc.flush()

    async def release(self, records: Sequence[StreamRecord]) -> None:
        """Give records back unhandled: they are delivered again at once."""
        for record in records:
            await record.message.nak()
        await self._nc.flush()

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def _decode(self, message: Msg) -> StreamRecord | None:
        """The record a message holds; None (counted, or a heartbeat handed on) if not."""
        headers = message.headers or {}
        try:
            publisher_id = int(headers["Shadow-Publisher-Id"])
            tap = headers["Shadow-Tap"]
        except (KeyError, ValueError):
            self._reject("headers")
            return None
        if tap != self.tap:
            self._reject("tap")
            return None
        if message.subject.endswith(HEARTBEAT_SUFFIX):
            try:
                heartbeat = Heartbeat.decode(message.data)
            except WireError as e:
                self._reject(e.reason)
                return None
            if heartbeat.publisher_id != publisher_id or heartbeat.tap != tap:
                self._reject("heartbeat")
            elif self.on_heartbeat is not None:
                self.on_heartbeat(heartbeat)
            return None
        try:
            envelope = decode_envelope(message.data)
            seq = int(headers["Shadow-Seq"])
        except WireError as e:
            self._reject(e.reason)
            return None
        except (KeyError, ValueError):
            self._reject("headers")
            return None
        if missing_fields(envelope) or envelope["seq"] != seq or envelope["tap"] != tap:
            self._reject("record")
            return None
        metadata = message.metadata
        return StreamRecord(
            publisher_id=publisher_id,
            tap=tap,
            seq=seq,
            envelope=envelope,
            payload=message.data,
            stream_sequence=metadata.sequence.stream,
            deliveries=metadata.num_delivered,
            message=message,
        )
