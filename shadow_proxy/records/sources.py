"""Record sources: one reader for record files, live taps and JetStream streams.

Every tool that reads records (``shadow-consumer``, ``shadow-trace``,
``shadow-replay``) takes the same source arguments (``add_arguments``) and
reads through ``open_source``, so a tool written against files works live and
at fleet scale unchanged (SPEC section 8):

- record files: paths, directories of rotated files, globs (``records/files.py``);
- a live tap over ZeroMQ: ``--endpoint tcp://HOST:PORT --topic T``, or
  ``--discover http://PROXY/shadow/taps --tap NAME``;
- a JetStream stream: ``--nats URL --stream S --tap NAME --durable NAME``
  (``--nats`` repeated or comma-separated; ``--stop-at-end``: stop once the
  durable has delivered what the stream holds, for batch use).

A source is an async iterator of ``Delivery`` values in the order the source
holds them (files: file order, then rotation order; live: arrival order).
Guarantees:

- heartbeats and other non-records are skipped (or yielded as heartbeats when
  asked, for the consumer's accounting);
- unreadable bytes and malformed records are counted by reason in
  ``stats.unreadable`` and never stop the reading;
- with ``dedup`` (the default), each ``(publisher_id, tap, seq)`` is yielded
  once; repeats are counted in ``stats.duplicates``. Records from files written
  before publisher ids were kept (publisher id 0) cannot be told apart and are
  all yielded;
- a delivery is acknowledged with ``await delivery.ack()`` once handled
  (JetStream redelivers what is not acknowledged; elsewhere it does nothing).

Memory: one record at a time, plus the deduplication state (per publisher and
tap, at most ``seqs.DEFAULT_MAX_HOLES`` holes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.records import files, wire
from shadow_proxy.records.discovery import discover
from shadow_proxy.records.envelope import check_envelope
from shadow_proxy.records.seqs import SeqTracker

#: File sources give the event loop a turn every this many entries.
YIELD_EVERY = 256


class SourceError(ValueError):
    """The source arguments name no readable source; the message says why."""


@attrs.frozen
class Delivery:
    """One record (or heartbeat) as a source delivered it."""

    #: Transport fields: topic, publisher id, transport sequence, publish time, payload.
    message: wire.Message
    #: The decoded record; None for a heartbeat.
    envelope: dict[str, Any] | None
    heartbeat: wire.Heartbeat | None = None
    #: Where it came from: a file path, an endpoint, a stream.
    where: str = ""
    _ack: Callable[[], Awaitable[None]] | None = None

    async def ack(self) -> None:
        """Say the record was handled (JetStream); a no-op for other sources."""
        if self._ack is not None:
            await self._ack()

    @property
    def acknowledgement(self) -> Callable[[], Awaitable[None]] | None:
        """The acknowledgement alone (it holds no record: JetStream's holds the
        reply subject), for a caller that acknowledges once its result is
        written; None where there is nothing to acknowledge."""
        return self._ack


@attrs.define
class SourceStats:
    """What a source read, skipped and could not read."""

    records: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    #: Unreadable or malformed input by reason (fixed words, never client text).
    unreadable: dict[str, int] = attrs.field(factory=dict)
    unreadable_bytes: int = 0
    files: int = 0

    def reject(self, reason: str, size: int = 0) -> None:
        self.unreadable[reason] = self.unreadable.get(reason, 0) + 1
        self.unreadable_bytes += size

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "heartbeats": self.heartbeats,
            "duplicates": self.duplicates,
            "unreadable": dict(sorted(self.unreadable.items())),
            "unreadable_bytes": self.unreadable_bytes,
            "files": self.files,
        }


@attrs.define
class Deduplicator:
    """Counts each ``(publisher_id, tap, seq)`` once (publisher id 0: never a repeat)."""

    seen: dict[tuple[int, str], SeqTracker] = attrs.field(factory=dict)

    def first_time(self, publisher_id: int, tap: str, seq: int) -> bool:
        if publisher_id == 0:
            return True
        tracker = self.seen.get((publisher_id, tap))
        if tracker is None:
            tracker = self.seen[publisher_id, tap] = SeqTracker()
        return tracker.observe(seq)


class RecordSource:
    """The common part of every source: decoding, checking, deduplication."""

    #: Whether records arrive as they happen (live) or are read from storage.
    live = False
    #: Whether a delivery not acknowledged is delivered again (JetStream): a
    #: caller that keeps records must have them written before it acknowledges.
    redelivers = False

    def __init__(self, *, dedup: bool = True, heartbeats: bool = False) -> None:
        self.stats = SourceStats()
        self.heartbeats = heartbeats
        self._dedup = Deduplicator() if dedup else None

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self.deliveries()

    def deliveries(self) -> AsyncIterator[Delivery]:
        raise NotImplementedError

    async def open(self) -> None:
        """Connect now, so that a missing source is found before any work
        (``SourceError``); iterating opens it too."""

    async def aclose(self) -> None:
        """Release sockets and connections (idempotent)."""

    def describe(self) -> str:
        raise NotImplementedError

    def _record(self, message: wire.Message, where: str, ack=None) -> Delivery | None:
        """A delivery for a record message, or None (counted) when it is not one."""
        try:
            envelope = wire.decode_envelope(message.payload)
        except wire.WireError as e:
            self.stats.reject(e.reason, len(message.payload))
            return None
        reason = check_envelope(envelope)
        if reason is not None:
            self.stats.reject(reason, len(message.payload))
            return None
        dedup = self._dedup
        if dedup is not None and not dedup.first_time(
            message.publisher_id, envelope["tap"], envelope["seq"]
        ):
            self.stats.duplicates += 1
            return None
        self.stats.records += 1
        return Delivery(message, envelope, where=where, ack=ack)

    def _heartbeat(self, message: wire.Message, where: str) -> Delivery | None:
        try:
            heartbeat = wire.Heartbeat.decode(message.payload)
        except wire.WireError as e:
            self.stats.reject(e.reason, len(message.payload))
            return None
        if heartbeat.publisher_id != message.publisher_id:
            self.stats.reject("heartbeat", len(message.payload))
            return None
        self.stats.heartbeats += 1
        return Delivery(message, None, heartbeat, where=where) if self.heartbeats else None


class FileSource(RecordSource):
    """Record files, in the order ``files.expand`` gives."""

    def __init__(self, paths: Sequence[Path], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.paths = list(paths)
        #: The files' sizes when opened, and about how much of them was read
        #: (``progress``: a progress line's total and ETA).
        self.total_bytes = sum(p.stat().st_size for p in self.paths if p.is_file())
        self.read_bytes = 0

    def describe(self) -> str:
        return f"{len(self.paths)} record file(s)"

    def progress(self) -> tuple[int, int]:
        """(bytes read, bytes in all), the first counted by payload within a file."""
        return self.read_bytes, self.total_bytes

    async def deliveries(self) -> AsyncIterator[Delivery]:
        count = 0
        done = 0
        for path in self.paths:
            self.stats.files += 1
            for entry in files.read_entries(path):
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                self.read_bytes += (
                    entry.skipped_bytes
                    if isinstance(entry, files.Unreadable)
                    else len(entry.payload) + files.LENGTH.size
                )
                if isinstance(entry, files.Unreadable):
                    self.stats.reject(entry.reason, entry.skipped_bytes)
                    continue
                if entry.topic.endswith(wire.HEARTBEAT_SUFFIX):
                    delivery = self._heartbeat(entry, str(path))
                else:
                    delivery = self._record(entry, str(path))
                if delivery is not None:
                    yield delivery
            with contextlib.suppress(OSError):
                done += path.stat().st_size
            self.read_bytes = done


class TapSource(RecordSource):
    """A live tap: a ZeroMQ SUB socket on one topic (and its heartbeats)."""

    live = True

    def __init__(
        self,
        endpoints: Sequence[str],
        topic: str,
        *,
        rcvhwm: int = 100_000,
        max_message_bytes: int = 256 * 2**20,
        curve: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``curve``: (the tap's public key file, this consumer's key pair file)
        for a tap with CURVE (``zmq.auth.create_certificates`` files)."""
        super().__init__(**kwargs)
        import zmq
        import zmq.asyncio

        self.endpoints = list(endpoints)
        self.topic = topic
        self._topic = topic.encode("utf-8")
        self._heartbeat_topic = wire.heartbeat_topic(topic).encode("utf-8")
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, rcvhwm)
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        socket.setsockopt(zmq.SUBSCRIBE, self._topic)
        socket.setsockopt(zmq.SUBSCRIBE, self._heartbeat_topic)
        if curve is not None:
            _curve_client(socket, *curve)
        for endpoint in self.endpoints:
            socket.connect(endpoint)
        self._socket = socket

    def describe(self) -> str:
        return f"topic {self.topic} at {','.join(self.endpoints)}"

    async def deliveries(self) -> AsyncIterator[Delivery]:
        where = ",".join(self.endpoints)
        while True:
            frames = await self._socket.recv_multipart()
            # Subscriptions match by prefix: compare the topic frame exactly.
            topic = bytes(frames[0]) if frames else b""
            if topic not in (self._topic, self._heartbeat_topic):
                self.stats.reject("topic")
                continue
            try:
                message = wire.decode_frames(frames)
            except wire.WireError as e:
                self.stats.reject(e.reason, sum(map(len, frames)))
                continue
            if topic == self._topic:
                delivery = self._record(message, where)
            else:
                delivery = self._heartbeat(message, where)
            if delivery is not None:
                yield delivery

    async def aclose(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
            self._context.term()


def _curve_client(socket: Any, server_key: str, client_key: str) -> None:
    """Make ``socket`` a CURVE client of the tap whose public key is in
    ``server_key``, with the key pair in ``client_key``; ``SourceError`` when a
    file cannot be used."""
    import zmq
    import zmq.auth

    try:
        server_public, _ = zmq.auth.load_certificate(server_key)
        public, secret = zmq.auth.load_certificate(client_key)
    except (OSError, ValueError) as e:
        msg = f"CURVE key file: {e}"
        raise SourceError(msg) from e
    if not secret:
        msg = f"--curve-client-key {client_key} holds no secret-key (use the .key_secret file)"
        raise SourceError(msg)
    socket.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, secret)


#: Records a reorder window holds by default (about 1 KiB of state each, plus
#: the records themselves).
DEFAULT_REORDER_WINDOW = 4096


async def in_arrival_order(
    deliveries: AsyncIterator[Delivery], window: int = DEFAULT_REORDER_WINDOW
) -> AsyncIterator[Delivery]:
    """Deliveries re-sorted by ``arrival_unix_ns`` within a bounded window.

    Joined records are published when their response ends, so a record file
    is in end order, not arrival order. Holding up to ``window`` deliveries in
    a heap restores arrival order wherever a record is overtaken by fewer than
    ``window`` later-arriving ones (at most ``window`` are held at any time).
    """
    heap: list[tuple[int, int, Delivery]] = []
    count = 0
    async for delivery in deliveries:
        count += 1
        heapq.heappush(heap, (delivery.envelope["arrival_unix_ns"], count, delivery))
        if len(heap) > window:
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def add_arguments(parser: argparse.ArgumentParser, *, files_allowed: bool = True) -> None:
    """The source arguments every tool takes (SPEC section 8)."""
    group = parser.add_argument_group("record source (one of)")
    if files_allowed:
        group.add_argument(
            "sources",
            nargs="*",
            metavar="SOURCE",
            help="record files written by shadow-consumer --record: paths, directories, globs",
        )
    group.add_argument(
        "--endpoint", action="append", default=[], help="live tap: tcp://HOST:PORT (repeatable)"
    )
    group.add_argument("--topic", help="live tap: the tap's topic")
    group.add_argument("--discover", metavar="URL", help="live tap: the proxy's /shadow/taps URL")
    group.add_argument("--tap", help="the tap's name (with --discover or --nats)")
    group.add_argument(
        "--nats",
        metavar="URL",
        action="append",
        help="JetStream server(s): repeat, or separate with commas",
    )
    group.add_argument("--stream", default="SHADOW", help="JetStream stream [SHADOW]")
    group.add_argument("--durable", help="JetStream durable consumer name (shared = split)")
    group.add_argument("--subject", help="JetStream: the tap's subject [shadow.TOPIC, see --topic]")
    group.add_argument(
        "--ack-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="JetStream: unacknowledged records come again after S (a new durable) [30]",
    )
    group.add_argument(
        "--stop-at-end",
        action="store_true",
        help="JetStream: stop once the durable has delivered everything the stream holds "
        "(its pending count reaches 0): a batch read of what is there",
    )
    group.add_argument(
        "--curve-server-key",
        metavar="FILE",
        help="live tap with CURVE: the tap's public key file (e.g. server.key)",
    )
    group.add_argument(
        "--curve-client-key",
        metavar="FILE",
        help="live tap with CURVE: this consumer's key pair file (e.g. client.key_secret), "
        "whose public key the tap's client_keys list",
    )


def open_source(
    args: argparse.Namespace,
    *,
    dedup: bool = True,
    heartbeats: bool = False,
    wait_for_stream: bool = False,
    log: Callable[[str], None] | None = None,
) -> RecordSource:
    """The source the parsed arguments name; ``SourceError`` when they name none or several.

    With ``wait_for_stream`` a JetStream stream that does not exist yet is
    waited for, not an error (a live reader started before the proxies).
    ``log`` takes a stream reader's lines for its user: that it waits, and the
    subjects the stream holds when nothing comes on the one it reads."""
    paths = list(getattr(args, "sources", None) or [])
    # --topic names the tap's topic for a stream too (its subject is shadow.TOPIC).
    live = bool(args.endpoint or args.discover or (args.topic and not args.nats))
    kinds = [k for k, given in (("files", paths), ("tap", live), ("nats", args.nats)) if given]
    if len(kinds) != 1:
        msg = (
            "give one source: record files, a live tap (--endpoint/--topic or "
            "--discover/--tap) or a stream (--nats/--tap/--durable)"
        )
        raise SourceError(msg + (f"; got {' and '.join(kinds)}" if kinds else ""))
    if getattr(args, "stop_at_end", False) and not args.nats:
        msg = "--stop-at-end is for a JetStream stream (--nats); files end, live taps do not"
        raise SourceError(msg)
    if paths:
        try:
            return FileSource(files.expand(paths), dedup=dedup, heartbeats=heartbeats)
        except FileNotFoundError as e:
            raise SourceError(str(e)) from e
    if args.nats:
        if not args.tap or not args.durable:
            msg = "--nats needs --tap NAME and --durable NAME"
            raise SourceError(msg)
        from shadow_proxy.records.jetstream_source import JetStreamSource

        servers = [url.strip() for given in args.nats for url in given.split(",") if url.strip()]
        return JetStreamSource(
            servers,
            args.stream,
            args.tap,
            args.durable,
            topic=args.topic,
            subject=args.subject,
            ack_wait_s=args.ack_wait,
            stop_at_end=bool(getattr(args, "stop_at_end", False)),
            wait_for_stream=wait_for_stream,
            log=log,
            dedup=dedup,
            heartbeats=heartbeats,
        )
    endpoints, topic = list(args.endpoint), args.topic
    if args.discover:
        if not args.tap:
            msg = "--discover needs --tap NAME"
            raise SourceError(msg)
        try:
            topic, endpoint = discover(args.discover, args.tap)
        except (OSError, ValueError, LookupError) as e:
            msg = f"discovery failed: {e}"
            raise SourceError(msg) from e
        endpoints.append(endpoint)
    if not topic or not endpoints:
        msg = "a live tap needs --topic and --endpoint, or --discover URL --tap NAME"
        raise SourceError(msg)
    server_key = getattr(args, "curve_server_key", None)
    client_key = getattr(args, "curve_client_key", None)
    if bool(server_key) != bool(client_key):
        msg = "CURVE needs both --curve-server-key and --curve-client-key"
        raise SourceError(msg)
    curve = (server_key, client_key) if server_key else None
    return TapSource(endpoints, topic, dedup=dedup, heartbeats=heartbeats, curve=curve)
