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
from collections.abc import Callable

from shadow_proxy.records import files, nats_access
from shadow_proxy.records.delivery import Delivery, RecordSource, SourceStats
from shadow_proxy.records.discovery import discover
from shadow_proxy.records.errors import SourceError
from shadow_proxy.records.file_source import DEFAULT_REORDER_WINDOW, FileSource, in_arrival_order
from shadow_proxy.records.nats_access import DEFAULT_CONNECT_BUDGET_S
from shadow_proxy.records.tap_source import TapSource

__all__ = [
    "DEFAULT_REORDER_WINDOW",
    "Delivery",
    "FileSource",
    "RecordSource",
    "SourceError",
    "SourceStats",
    "TapSource",
    "add_arguments",
    "in_arrival_order",
    "open_source",
]


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
    nats_access.add_arguments(group)
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

        access = nats_access.from_arguments(args)
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
            access=access,
            connect_budget_s=getattr(args, "nats_connect_budget", DEFAULT_CONNECT_BUDGET_S),
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
    curve = (server_key, client_key) if server_key and client_key else None
    return TapSource(endpoints, topic, dedup=dedup, heartbeats=heartbeats, curve=curve)
