"""Records from a JetStream stream, read with a durable pull consumer (SPEC 8 and 9).

``JetStreamSource`` is the ``RecordSource`` that ``sources.open_source`` opens
for ``--nats URL --stream S --tap NAME --durable NAME``. It yields a
``Delivery`` per record and acknowledges nothing on its own: the caller handles
the record (counts it, writes it, replays it) and then ``await
delivery.ack()``. A record not acknowledged within the durable's ``ack_wait``
is delivered again, to this process or to another one on the same durable, so
a reader that dies loses nothing and a restarted one resumes at the durable's
position. Several processes on one durable split the records: the way to
scale a reader out.

Delivery is at least once; with ``dedup`` each ``(publisher_id, tap, seq)`` is
yielded once per process (a redelivery of a record already yielded is
acknowledged here and counted in ``stats.duplicates``).

The durable filters the tap's subject and its heartbeat subject
(``{subject}.heartbeat``); heartbeats are acknowledged when read. A message
that is not a record of this tap (no Shadow headers, another tap, not
MessagePack, not an envelope) is counted in ``stats.unreadable`` by a fixed
reason word, acknowledged so that it is not delivered again, and skipped.

Each delivery's ``message`` carries the publisher's headers as SPEC 4's
transport fields: ``publisher_id`` from ``Shadow-Publisher-Id``, ``sequence``
from ``Shadow-Transport-Seq`` (dense per publisher: a gap is a record lost
after the publisher took it over), ``published_at`` the stream's timestamp.

With ``stop_at_end`` (``--stop-at-end``) the source is a batch read of what
the stream holds: it ends once the durable has delivered everything (the
``num_pending`` of the last message delivered, or of the consumer's info after
a fetch that came back empty, is 0), and it is not ``live`` (a tool paces its
records as it paces a file's). A durable lets at most its ``max_ack_pending``
records be unacknowledged: a reader that holds them all (``shadow-trace``
acknowledges once its output is written) ends there too, and says so on
``log``; the rest is for the next run.

Acknowledgements hold only the message's reply subject, not its data: a
caller may keep them until its result is written without keeping the records.
A reader that stops in the middle of a fetched batch (``--max-records``)
gives the rest back at once (a negative acknowledgement), so the next reader
gets them without waiting for ``ack_wait``.

Faults (issue 31). The connection is ``nats_connect.connect``'s: a server that
refuses (credentials, TLS, permissions) is a ``NatsRefused``, none answering
within ``connect_budget_s`` a ``NatsUnreachable``: one line each, for the tool
to print before it exits 2. A node lost while reading (the durable's leader
killed: fetches answer 503 or nothing until a new leader is elected) is waited
out (``jetstream_retry``): fetches tried again with backoff, one line when
the outage starts and one when it ends, confirmed acknowledgements; the client
reconnects to another server. What still comes again is counted once.

A missing stream is a ``SourceError`` unless the source was opened with
``wait_for_stream``: then it is looked for again every ``STREAM_POLL_S`` (a
consumer started before any proxy has created the stream, as pods start in
any order, waits for it instead of exiting), with one line on ``log`` when the
wait starts. A reader with a log that gets nothing at all on its subject for
``HINT_AFTER_S`` names the subjects the stream does hold, once.

The subject of a tap is the proxy's: ``shadow.{topic}``, the topic defaulting
to ``shadow-requests-{tap}`` (pass ``topic`` or ``subject`` when the tap names
its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import nats.aio.client
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from shadow_proxy.records import nats_connect, wire
from shadow_proxy.records.delivery import Delivery, RecordSource
from shadow_proxy.records.errors import NatsRefused, SourceError
from shadow_proxy.records.jetstream_retry import TRANSIENT, Retrier
from shadow_proxy.records.nats_access import (
    DEFAULT_CONNECT_BUDGET_S,
    NatsAccess,
    redact,
    redact_all,
)

DEFAULT_STREAM = "SHADOW"
#: How long a delivered record may stay unacknowledged before it is delivered
#: again (JetStream's default): longer than handling one batch takes.
DEFAULT_ACK_WAIT_S = 30.0
DEFAULT_BATCH = 256
#: At most this many records delivered and not acknowledged, per durable.
MAX_ACK_PENDING = 4096
FETCH_WAIT_S = 1.0
#: How often a source opened with ``wait_for_stream`` looks for its stream again.
STREAM_POLL_S = 1.0
#: After this long with nothing on the subject (a live tap sends a heartbeat
#: every second), a reader with a log says which subjects the stream holds.
HINT_AFTER_S = 5.0
HINT_SUBJECTS = 5


def default_subject(tap: str, topic: str | None = None) -> str:
    """The subject a tap publishes to when its configuration names none."""
    return f"shadow.{topic or f'shadow-requests-{tap}'}"


class JetStreamSource(RecordSource):
    """A durable pull consumer on one tap's subject (opened on first iteration)."""

    live = True
    redelivers = True

    def __init__(
        self,
        servers: Sequence[str],
        stream: str,
        tap: str,
        durable: str,
        *,
        topic: str | None = None,
        subject: str | None = None,
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
        batch: int = DEFAULT_BATCH,
        stop_at_end: bool = False,
        wait_for_stream: bool = False,
        log: Callable[[str], None] | None = None,
        access: NatsAccess | None = None,
        connect_budget_s: float = DEFAULT_CONNECT_BUDGET_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.servers = list(servers)
        self.stream = stream
        self.tap = tap
        self.durable = durable
        self.subject = subject or default_subject(tap, topic)
        #: What the consumer's accounts and summary call the source.
        self.topic = self.subject
        self.endpoints = [redact(url) for url in self.servers]
        self.ack_wait_s = ack_wait_s
        self.batch = batch
        self.stop_at_end = stop_at_end
        self.live = not stop_at_end
        self.wait_for_stream = wait_for_stream
        self.log = log
        self.access = access or NatsAccess()
        self.connect_budget_s = connect_budget_s
        self._retry = Retrier(f"stream {stream!r}", log)
        self._nc: nats.aio.client.Client | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._outages: nats_connect.Outages | None = None

    @property
    def filter_subjects(self) -> list[str]:
        return [self.subject, wire.heartbeat_topic(self.subject)]

    def describe(self) -> str:
        return (
            f"stream {self.stream} subject {self.subject} durable {self.durable} "
            f"at {redact_all(self.servers)}"
        )

    async def open(self) -> None:
        """Connect and bind the durable (created if it does not exist); once.
        Raises
        ``SourceError`` when the stream is missing or the durable reads other
        subjects (another tap's readers chose the same name)."""
        if self._sub is not None:
            return
        self._nc, self._outages = await nats_connect.connect(
            self.servers,
            self.access,
            name=f"shadow reader {self.durable}",
            budget_s=self.connect_budget_s,
            log=self.log,
        )
        config = api.ConsumerConfig(
            durable_name=self.durable,
            filter_subjects=self.filter_subjects,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=MAX_ACK_PENDING,
        )
        js = self._nc.jetstream()
        missing = f"no JetStream stream {self.stream!r} at {redact_all(self.servers)}"
        waiting = False
        while True:
            try:
                sub = await js.pull_subscribe(
                    "", durable=self.durable, stream=self.stream, config=config
                )
                info = await sub.consumer_info()
                self._sub = sub
                break
            except nats.js.errors.NotFoundError as e:
                if not self.wait_for_stream:
                    await self.aclose()
                    raise SourceError(missing) from e
                if not waiting and self.log is not None:
                    self.log(f"{missing} yet: waiting for a proxy to create it")
                waiting = True
                await asyncio.sleep(STREAM_POLL_S)
            except TRANSIENT as e:
                if self._outages is not None and self._outages.refusal is not None:
                    await self.aclose()
                self._refused()  # no answer because refused (permissions): say so
                await self._retry.failed(e)
            except nats.js.errors.APIError as e:
                await self.aclose()
                msg = f"JetStream refused durable {self.durable!r}: {e.description}"
                raise NatsRefused(msg) from e
            self._refused()
        self._retry.recovered()
        found = [s for s in info.config.filter_subjects or [info.config.filter_subject or ""] if s]
        if sorted(found) != sorted(self.filter_subjects):
            await self.aclose()
            msg = (
                f"durable {self.durable!r} of stream {self.stream!r} reads {found}, not "
                f"{self.filter_subjects}: choose another --durable for this tap"
            )
            raise SourceError(msg)

    async def aclose(self) -> None:
        if self._outages is not None:
            self._outages.armed = False  # closing is no outage
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self._nc.close()

    def _refused(self) -> None:
        """A refusal the connection saw (a permissions violation) ends the read."""
        if self._outages is not None and self._outages.refusal is not None:
            msg = f"NATS refused reader {self.durable!r}: {self._outages.refusal}"
            raise NatsRefused(msg)

    @property
    def retries(self) -> int:
        """Fetches and acknowledgements tried again through outages."""
        return self._retry.retries

    async def _fetch(self) -> list[Msg]:
        """One batch (empty when the pull ended with nothing), through outages."""
        assert self._sub is not None
        while True:
            self._refused()
            try:
                messages = await self._sub.fetch(self.batch, timeout=FETCH_WAIT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                if self._nc is not None and self._nc.is_connected:
                    return []  # nothing came within the wait: not an outage
                await self._retry.failed(nats.errors.ConnectionReconnectingError())
                continue
            except TRANSIENT as e:
                self._refused()
                await self._retry.failed(e)
                continue
            except nats.js.errors.APIError as e:
                msg = f"JetStream: durable {self.durable!r} of {self.stream!r}: {e.description}"
                raise SourceError(msg) from e
            self._retry.recovered()
            return messages

    async def deliveries(self) -> AsyncIterator[Delivery]:
        if self._sub is None:
            await self.open()
        quiet_since = time.monotonic()
        hinted = False
        while True:
            messages = await self._fetch()
            if not messages:  # a fetch may also end empty (the pull request expired)
                if self.stop_at_end and await self._at_end():
                    return
                if not hinted and time.monotonic() - quiet_since > HINT_AFTER_S:
                    hinted = True
                    await self._hint_other_subjects()
                continue
            hinted = True  # something arrives on the subject: it is the right one
            taken = 0
            try:
                for message in messages:
                    taken += 1
                    delivery = self._delivery(message)
                    if delivery is None or delivery.heartbeat is not None:
                        with contextlib.suppress(nats.errors.Error, OSError):
                            await message.ack()
                    if delivery is not None:
                        yield delivery
            finally:  # the reader stopped mid-batch: the rest is for the next one, now
                for message in messages[taken:]:
                    with contextlib.suppress(nats.errors.Error, OSError):
                        await message.nak()
            if self.stop_at_end and messages[-1].metadata.num_pending == 0:
                return

    async def _at_end(self) -> bool:
        """With ``stop_at_end``, after an empty fetch: whether there is nothing
        more to read now (nothing pending), or nothing more this reader can be
        given (it holds ``max_ack_pending`` unacknowledged records)."""
        assert self._sub is not None
        try:
            info = await self._sub.consumer_info()
        except TRANSIENT as e:
            await self._retry.failed(e)
            return False
        if not info.num_pending:
            return True
        limit = info.config.max_ack_pending
        if limit and limit > 0 and (info.num_ack_pending or 0) >= limit:
            if self.log is not None:
                self.log(
                    f"durable {self.durable!r} lets {limit} records be unacknowledged and this "
                    f"reader holds them all: stopping here ({info.num_pending} left for the "
                    "next run)"
                )
            return True
        return False

    async def _hint_other_subjects(self) -> None:
        """Nothing, not even a heartbeat, came on the subject: when the stream
        holds other subjects, say so once (a tap with its own ``topic`` read
        without ``--topic`` is the usual cause). Best effort."""
        if self.log is None or self._nc is None:
            return
        try:
            info = await self._nc.jetstream().stream_info(self.stream, subjects_filter=">")
        except (nats.errors.Error, TimeoutError):
            return
        held = sorted(info.state.subjects or {})
        if held and self.subject not in held:
            shown = ", ".join(held[:HINT_SUBJECTS]) + (", ..." if len(held) > HINT_SUBJECTS else "")
            self.log(
                f"nothing on {self.subject} in {HINT_AFTER_S:.0f} s; stream {self.stream!r} "
                f"holds {shown}: for a tap with its own topic pass --topic TOPIC"
            )

    def _delivery(self, message: Msg) -> Delivery | None:
        """The delivery a message makes; None (counted) when it is none."""
        headers = message.headers or {}
        try:
            publisher_id = int(headers["Shadow-Publisher-Id"])
            tap = headers["Shadow-Tap"]
            sequence = int(headers.get("Shadow-Transport-Seq") or headers.get("Shadow-Seq") or 0)
        except (KeyError, ValueError):
            self.stats.reject("headers", len(message.data))
            return None
        if tap != self.tap:
            self.stats.reject("tap", len(message.data))
            return None
        stamp = message.metadata.timestamp
        published_at_ms = int(stamp.timestamp() * 1000) if stamp is not None else 0
        transport = wire.Message(
            message.subject, publisher_id, max(0, sequence), published_at_ms, message.data
        )
        where = f"{self.stream}#{message.metadata.sequence.stream}"
        if message.subject == self.subject:
            assert self._nc is not None
            ack = self._retry.confirmed_ack(self._nc, message.reply)
            return self._record(transport, where, ack=ack)
        return self._heartbeat(transport, where)
