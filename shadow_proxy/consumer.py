"""The consumer: reads one tap's topic and keeps totals (SPEC section 7).

Two halves. ``Accounts`` (with ``SeqTracker`` and ``PublisherTotals``) is pure
accounting: frames in, totals out, no socket and no clock of its own (callers pass
``now``, monotonic seconds). ``run_consumer`` is the runner: a SUB socket on a
context it owns, a live line on stderr every interval, the JSON summary on stdout
at the end, optionally a summary file and a raw record file.

Gaps. Per publisher (one tap socket of one proxy process), ``seq`` values and
transport sequences are tracked as a set of seen intervals. A value missing
between the lowest and highest seen is a gap; out-of-order arrival is not (a late
record fills its hole). A consumer that joins late starts its range at the first
value it sees. Loss after the highest value seen is only visible through the
tap's heartbeat: when a heartbeat says ``next_seq = N`` and, ``grace`` seconds
later, values below N are still missing above the highest seen, they are counted
as ``tail_loss`` (likewise ``last_transport_sequence`` for the transport). A
publisher restart shows up as a new publisher id with totals of its own.

``tap_gaps`` counts every missing ``seq`` (dropped in the tap or lost on the
way); ``transport_gaps`` counts only what ZeroMQ lost, so their difference is what
the tap dropped. Memory is bounded: at most ``max_holes`` holes are remembered per
sequence; beyond that the oldest hole is written off as lost, and a record that
still arrives into it later counts as a duplicate.
"""

from __future__ import annotations

# TRANSITIONAL (branch nats, before the issue-11 layout lands): lets the new modules
# under shadow_proxy/consumer/ import while this file is still a module.
# Delete these two lines when this module moves into the package.
__path__ = [__file__.removesuffix(".py")]

import argparse
import bisect
import collections
import json
import os
import signal
import struct
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from shadow_proxy import records, wire

DEFAULT_GRACE_S = 2.0
DEFAULT_MAX_HOLES = 4096
_KNOWN_OUTCOMES = records.OUTCOMES
_RECORD_LENGTH = struct.Struct(">I")


# --- pure accounting ----------------------------------------------------------------


@attrs.define
class SeqTracker:
    """Which values of one sequence were seen, as sorted disjoint [start, end) runs."""

    max_holes: int = DEFAULT_MAX_HOLES
    duplicates: int = 0
    written_off: int = 0
    _starts: list[int] = attrs.field(factory=list)
    _ends: list[int] = attrs.field(factory=list)
    _anchor: int | None = None
    _end: int | None = None

    def observe(self, value: int) -> bool:
        """Note one value; False if it was seen before (a duplicate)."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, value) - 1
        if i >= 0 and value < ends[i]:
            self.duplicates += 1
            return False
        joins_left = i >= 0 and ends[i] == value
        joins_right = i + 1 < len(starts) and starts[i + 1] == value + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = value + 1
        elif joins_right:
            starts[i + 1] = value
        else:
            starts.insert(i + 1, value)
            ends.insert(i + 1, value + 1)
            if len(starts) > self.max_holes + 1:
                self.written_off += starts[1] - ends[0]
                ends[0] = ends[1]
                del starts[1], ends[1]
        return True

    def anchor(self, start: int) -> None:
        """Values from ``start`` on are expected: set only before anything is seen."""
        if not self._starts and self._anchor is None:
            self._anchor = start

    def confirm_end(self, end: int) -> None:
        """Every value below ``end`` was sent (heartbeat, past its grace)."""
        if self._end is None or end > self._end:
            self._end = end

    @property
    def first(self) -> int | None:
        return self._starts[0] if self._starts else None

    @property
    def last(self) -> int | None:
        return self._ends[-1] - 1 if self._ends else None

    @property
    def seen(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def gaps(self) -> int:
        """Values missing between the start of the range and the highest seen."""
        if not self._starts:
            return 0
        holes = sum(self._starts[k + 1] - self._ends[k] for k in range(len(self._starts) - 1))
        if self._anchor is not None and self._anchor < self._starts[0]:
            holes += self._starts[0] - self._anchor
        return holes + self.written_off

    def tail_loss(self) -> int:
        """Values a heartbeat confirmed as sent, above the highest seen, never seen."""
        if self._end is None:
            return 0
        top = self._ends[-1] if self._ends else self._anchor
        if top is None:
            return 0
        return max(0, self._end - top)


@attrs.define
class PublisherTotals:
    """Totals for one publisher id: one tap socket in one proxy process."""

    publisher_id: int
    max_holes: int = DEFAULT_MAX_HOLES
    tap: str | None = None
    records: int = 0
    responses: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    outcomes: dict[str, int] = attrs.field(factory=dict)
    heartbeats: int = 0
    last_heartbeat: wire.Heartbeat | None = None
    seqs: SeqTracker = attrs.field()
    transport: SeqTracker = attrs.field()
    _pending: collections.deque[tuple[float, wire.Heartbeat]] = attrs.field(
        factory=lambda: collections.deque(maxlen=64)
    )

    @seqs.default
    def _seqs_default(self) -> SeqTracker:
        return SeqTracker(max_holes=self.max_holes)

    @transport.default
    def _transport_default(self) -> SeqTracker:
        return SeqTracker(max_holes=self.max_holes)

    def add_record(self, transport_sequence: int | None, envelope: dict[str, Any]) -> bool:
        """Count one decoded record; False (and nothing counted) if a duplicate.
        ``transport_sequence`` is None for a transport without one (JetStream)."""
        if transport_sequence is not None:
            self.transport.observe(transport_sequence)
        if not self.seqs.observe(envelope["seq"]):
            return False
        self.tap = envelope["tap"]
        self.records += 1
        self.prompt_tokens += len(envelope["request"]["token_ids"])
        response = envelope.get("response")
        if response is not None:
            self.responses += 1
            self.output_tokens += response.get("output_tokens", 0)
            outcome = response.get("outcome")
            name = outcome if outcome in _KNOWN_OUTCOMES else "unknown"
            self.outcomes[name] = self.outcomes.get(name, 0) + 1
        return True

    def add_heartbeat(self, heartbeat: wire.Heartbeat, now: float) -> None:
        self.heartbeats += 1
        self.tap = heartbeat.tap
        self.last_heartbeat = heartbeat
        self.seqs.anchor(heartbeat.next_seq)
        last = heartbeat.last_transport_sequence
        self.transport.anchor(0 if last is None else last + 1)
        self._pending.append((now, heartbeat))

    def settle(self, now: float, grace: float) -> None:
        """Let heartbeats older than ``grace`` confirm what was sent."""
        while self._pending and now - self._pending[0][0] >= grace:
            _, heartbeat = self._pending.popleft()
            self.seqs.confirm_end(heartbeat.next_seq)
            if heartbeat.last_transport_sequence is not None:
                self.transport.confirm_end(heartbeat.last_transport_sequence + 1)

    def summary(self) -> dict[str, Any]:
        heartbeat = self.last_heartbeat
        return {
            "publisher_id": self.publisher_id,
            "tap": self.tap,
            "records": self.records,
            "responses": self.responses,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "outcomes": dict(sorted(self.outcomes.items())),
            "first_seq": self.seqs.first,
            "last_seq": self.seqs.last,
            "tap_gaps": self.seqs.gaps(),
            "tail_loss": self.seqs.tail_loss(),
            "transport_gaps": self.transport.gaps(),
            "transport_tail_loss": self.transport.tail_loss(),
            "duplicates": self.seqs.duplicates,
            "transport_duplicates": self.transport.duplicates,
            "heartbeats": self.heartbeats,
            "last_heartbeat": None
            if heartbeat is None
            else {
                "next_seq": heartbeat.next_seq,
                "last_transport_sequence": heartbeat.last_transport_sequence,
                "queued": heartbeat.queued,
                "published": heartbeat.published,
                "dropped": dict(heartbeat.dropped),
                "publish_errors": heartbeat.publish_errors,
            },
        }


_SUMMED = (
    "records",
    "responses",
    "prompt_tokens",
    "output_tokens",
    "tap_gaps",
    "tail_loss",
    "transport_gaps",
    "transport_tail_loss",
    "duplicates",
    "heartbeats",
)


def _check_record(envelope: dict[str, Any]) -> str | None:
    """None if the envelope can be counted, else the reason it cannot."""
    if records.missing_fields(envelope):
        return "record"
    if envelope["schema_version"] != records.ENVELOPE_SCHEMA_VERSION:
        return "schema"
    request = envelope["request"]
    seq = envelope["seq"]
    response = envelope.get("response")
    if (
        type(seq) is not int
        or seq < 0
        or not isinstance(envelope["tap"], str)
        or not isinstance(request, dict)
        or not isinstance(request.get("token_ids"), list)
        or (response is not None and not isinstance(response, dict))
        or (response is not None and type(response.get("output_tokens", 0)) is not int)
    ):
        return "record"
    return None


@attrs.define
class Accounts:
    """Everything one consumer has seen on one topic. Never raises on bad input."""

    topic: str
    grace: float = DEFAULT_GRACE_S
    max_holes: int = DEFAULT_MAX_HOLES
    publishers: dict[int, PublisherTotals] = attrs.field(factory=dict)
    undecodable: dict[str, int] = attrs.field(factory=dict)

    def _reject(self, reason: str) -> None:
        self.undecodable[reason] = self.undecodable.get(reason, 0) + 1

    def _publisher(self, publisher_id: int) -> PublisherTotals:
        totals = self.publishers.get(publisher_id)
        if totals is None:
            totals = PublisherTotals(publisher_id, max_holes=self.max_holes)
            self.publishers[publisher_id] = totals
        return totals

    def on_frames(self, frames: Sequence[bytes], now: float) -> wire.Message | None:
        """Account for one multipart message; the message if it was a new record."""
        # The subscription matches by prefix: compare the topic frame exactly.
        if frames and bytes(frames[0]) not in (self._topic_bytes, self._heartbeat_bytes):
            self._reject("topic")
            return None
        try:
            message = wire.decode_frames(frames)
        except wire.WireError as exc:
            self._reject(exc.reason)
            return None
        if message.topic == self.topic:
            return self._on_record(message)
        self._on_heartbeat(message, now)
        return None

    @property
    def _topic_bytes(self) -> bytes:
        return self.topic.encode("utf-8")

    @property
    def _heartbeat_bytes(self) -> bytes:
        return wire.heartbeat_topic(self.topic).encode("utf-8")

    def _on_record(self, message: wire.Message) -> wire.Message | None:
        try:
            envelope = wire.decode_envelope(message.payload)
        except wire.WireError as exc:
            self._reject(exc.reason)
            return None
        reason = _check_record(envelope)
        if reason is not None:
            self._reject(reason)
            return None
        totals = self._publisher(message.publisher_id)
        if not totals.add_record(message.sequence, envelope):
            return None
        return message

    def _on_heartbeat(self, message: wire.Message, now: float) -> None:
        try:
            heartbeat = wire.Heartbeat.decode(message.payload)
        except wire.WireError as exc:
            self._reject(exc.reason)
            return
        if heartbeat.publisher_id != message.publisher_id:
            self._reject("heartbeat")
            return
        self._publisher(message.publisher_id).add_heartbeat(heartbeat, now)

    def on_envelope(self, publisher_id: int, envelope: dict[str, Any]) -> bool:
        """Account for one record read without ZeroMQ framing (a JetStream
        message: no transport sequence). True if it was new."""
        reason = _check_record(envelope)
        if reason is not None:
            self._reject(reason)
            return False
        return self._publisher(publisher_id).add_record(None, envelope)

    def on_heartbeat(self, heartbeat: wire.Heartbeat, now: float) -> None:
        """Account for a heartbeat read without ZeroMQ framing."""
        self._publisher(heartbeat.publisher_id).add_heartbeat(heartbeat, now)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.publishers.values())

    def summary(self, now: float) -> dict[str, Any]:
        """Totals over all publishers, then one entry per publisher."""
        per_publisher = []
        for totals in self.publishers.values():
            totals.settle(now, self.grace)
            per_publisher.append(totals.summary())
        overall: dict[str, Any] = {"topic": self.topic}
        for name in _SUMMED:
            overall[name] = sum(p[name] for p in per_publisher)
        outcomes: dict[str, int] = {}
        for entry in per_publisher:
            for name, count in entry["outcomes"].items():
                outcomes[name] = outcomes.get(name, 0) + count
        overall["outcomes"] = dict(sorted(outcomes.items()))
        overall["undecodable"] = dict(sorted(self.undecodable.items()))
        overall["publishers"] = per_publisher
        return overall


# --- files ----------------------------------------------------------------------------


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write the summary as JSON, atomically (a reader never sees half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


@attrs.define
class RecordFile:
    """Raw records, each a u32 big-endian length then the envelope's MessagePack.

    When the next record would take the file past ``max_bytes``, ``FILE`` becomes
    ``FILE.1`` (``FILE.1`` becomes ``FILE.2`` ...) and at most ``keep`` old files
    are kept.
    """

    path: Path
    max_bytes: int
    keep: int
    _file: Any = None
    _size: int = 0

    def write(self, payload: bytes) -> None:
        entry = _RECORD_LENGTH.pack(len(payload)) + payload
        if self._file is None:
            self._open()
        if self._size > 0 and self._size + len(entry) > self.max_bytes:
            self._rotate()
        self._file.write(entry)
        self._size += len(entry)

    def _open(self) -> None:
        self._file = self.path.open("ab")
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self._file.close()
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        oldest.unlink(missing_ok=True)
        for k in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = self.path.open("wb")
        self._size = 0

    def flush(self) -> None:
        """Hand what was written to the OS (before the records are acknowledged)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_record_file(path: Path) -> list[bytes]:
    """The raw records of one file written by ``RecordFile`` (for tools and tests)."""
    data = path.read_bytes()
    out, offset = [], 0
    while offset + _RECORD_LENGTH.size <= len(data):
        (length,) = _RECORD_LENGTH.unpack_from(data, offset)
        offset += _RECORD_LENGTH.size
        out.append(data[offset : offset + length])
        offset += length
    return out


# --- discovery --------------------------------------------------------------------------

_ANY_HOSTS = {"0.0.0.0", "*", "[::]", "::"}


def discover(url: str, tap: str, timeout: float = 5.0) -> tuple[str, str]:
    """(topic, endpoint) of the tap named ``tap`` from the proxy's tap list.

    The list is JSON: a list of ``{name, topic, endpoint}`` (or ``{"taps": [...]}``).
    An endpoint bound on every interface is reached at the proxy's own host.
    """
    with urllib.request.urlopen(url, timeout=timeout) as response:
        listing = json.loads(response.read())
    if isinstance(listing, dict):
        listing = listing.get("taps", [])
    for entry in listing if isinstance(listing, list) else []:
        if isinstance(entry, dict) and entry.get("name") == tap:
            topic, endpoint = entry.get("topic"), entry.get("endpoint")
            if not isinstance(topic, str) or not isinstance(endpoint, str):
                break
            scheme, _, rest = endpoint.partition("://")
            host, _, port = rest.rpartition(":")
            if scheme == "tcp" and host in _ANY_HOSTS:
                proxy_host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
                if ":" in proxy_host:
                    proxy_host = f"[{proxy_host}]"
                endpoint = f"tcp://{proxy_host}:{port}"
            return topic, endpoint
    names = [e.get("name") for e in listing if isinstance(e, dict)] if listing else []
    msg = f"tap {tap!r} not found at {url} (taps: {names})"
    raise LookupError(msg)


# --- the runner -------------------------------------------------------------------------


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            msg = f"must be positive (got {text})"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-consumer",
        description="Count what a shadow-proxy tap publishes. Live lines go to stderr, "
        "the JSON summary to stdout at the end (Ctrl-C, SIGTERM, --duration, --max-records).",
    )
    parser.add_argument(
        "--endpoint", action="append", default=[], help="tcp://host:port (repeatable)"
    )
    parser.add_argument("--topic", help="the tap's topic")
    parser.add_argument("--discover", metavar="URL", help="the proxy's /shadow/taps URL")
    parser.add_argument("--tap", help="tap name to look up with --discover")
    parser.add_argument("--interval", type=_positive(float), default=1.0, metavar="S")
    parser.add_argument("--summary-path", type=Path, metavar="FILE")
    parser.add_argument("--record", type=Path, metavar="FILE", help="keep raw records here")
    parser.add_argument("--record-max-bytes", type=_positive(int), default=256 * 2**20)
    parser.add_argument("--record-keep", type=int, default=5, metavar="N")
    parser.add_argument("--duration", type=_positive(float), metavar="S")
    parser.add_argument("--max-records", type=_positive(int), metavar="N")
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="how long after a heartbeat a missing tail counts as lost",
    )
    parser.add_argument(
        "--nats",
        action="append",
        default=[],
        metavar="URL",
        help="read the tap from a JetStream stream on this server (repeatable; with --tap "
        "and --durable)",
    )
    parser.add_argument("--stream", default="SHADOW", help="the JetStream stream (with --nats)")
    parser.add_argument(
        "--durable", metavar="NAME", help="the durable consumer: readers sharing it split records"
    )
    parser.add_argument(
        "--subject", help="the tap's subject (default shadow.TOPIC, see --topic; with --nats)"
    )
    parser.add_argument(
        "--ack-wait",
        type=_positive(float),
        default=30.0,
        metavar="S",
        help="unacknowledged records are delivered again after this (a new durable only)",
    )
    parser.add_argument("--rcvhwm", type=_positive(int), default=100_000)
    parser.add_argument("--max-message-bytes", type=_positive(int), default=256 * 2**20)
    return parser


def _live_line(summary: dict[str, Any], rate: float) -> str:
    return (
        f"records={summary['records']} ({rate:.0f}/s) "
        f"prompt_tokens={summary['prompt_tokens']} output_tokens={summary['output_tokens']} "
        f"tap_gaps={summary['tap_gaps']} tail_loss={summary['tail_loss']} "
        f"transport_gaps={summary['transport_gaps']} duplicates={summary['duplicates']} "
        f"undecodable={sum(summary['undecodable'].values())}"
    )


def run_consumer(
    argv: Sequence[str],
    *,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run until ``stop`` is set, ``--duration`` passes or ``--max-records`` arrive.

    Prints the JSON summary to ``out`` and returns 0; 2 on a usage error.
    """
    import zmq  # the runner only: the accounting above stays socket-free

    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.nats:
        from shadow_proxy.consumer.jetstream import run_jetstream

        return run_jetstream(args, parser, stop=stop or threading.Event(), out=out, err=err)
    endpoints = list(args.endpoint)
    topic = args.topic
    if args.discover:
        if not args.tap:
            parser.error("--discover needs --tap NAME")
        try:
            topic, endpoint = discover(args.discover, args.tap)
        except (OSError, ValueError, LookupError) as exc:
            print(f"shadow-consumer: discovery failed: {exc}", file=err)
            return 2
        endpoints.append(endpoint)
    if not topic or not endpoints:
        parser.error("give --topic and --endpoint, or --discover URL --tap NAME")

    stop = stop or threading.Event()
    accounts = Accounts(topic, grace=args.grace)
    recorder = (
        RecordFile(args.record, args.record_max_bytes, max(0, args.record_keep))
        if args.record
        else None
    )
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVHWM, args.rcvhwm)
    socket.setsockopt(zmq.MAXMSGSIZE, args.max_message_bytes)
    socket.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
    socket.setsockopt(zmq.SUBSCRIBE, wire.heartbeat_topic(topic).encode("utf-8"))
    started = time.monotonic()
    try:
        for endpoint in endpoints:
            socket.connect(endpoint)
        print(f"subscribed topic={topic} endpoints={','.join(endpoints)}", file=err)
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        next_report = started + args.interval
        last_report = (started, 0)
        deadline = None if args.duration is None else started + args.duration
        while not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if args.max_records is not None and accounts.records >= args.max_records:
                break
            if now >= next_report:
                summary = accounts.summary(now)
                rate = (summary["records"] - last_report[1]) / max(now - last_report[0], 1e-9)
                print(_live_line(summary, rate), file=err, flush=True)
                if args.summary_path:
                    write_summary(args.summary_path, _with_run(summary, endpoints, now - started))
                last_report = (now, summary["records"])
                next_report = now + args.interval
            timeout_ms = max(1, int(min(0.1, next_report - now) * 1000))
            if not poller.poll(timeout_ms):
                continue
            for _ in range(1024):  # drain a batch, then look at the clock again
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = accounts.on_frames(frames, time.monotonic())
                if message is not None and recorder is not None:
                    recorder.write(message.payload)
                if args.max_records is not None and accounts.records >= args.max_records:
                    break
    finally:
        socket.close(linger=0)
        context.term()
        if recorder is not None:
            recorder.close()

    now = time.monotonic()
    summary = _with_run(accounts.summary(now), endpoints, now - started)
    if args.summary_path:
        write_summary(args.summary_path, summary)
    print(json.dumps(summary, indent=2), file=out, flush=True)
    return 0


def _with_run(summary: dict[str, Any], endpoints: list[str], elapsed: float) -> dict[str, Any]:
    return {"endpoints": endpoints, "elapsed_s": round(elapsed, 3), **summary}


def consumer_main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: SIGINT and SIGTERM end the run with the summary, exit 0."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run_consumer(sys.argv[1:] if argv is None else argv, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(consumer_main())
