"""A shard's side of its pipe to the main: the ``RecordSink`` its joiner publishes
into, and the buffer of what the shard sends.

Every record, drop and skip the joiner publishes becomes a message to the main
(``worker/messages.py``), which takes the seqs (``worker/main/publishing.py``);
the outbox notes which taps a request touched, so that the shard can tell what a
failure cost (``worker/shard/loop.py``). Messages are buffered and written by
``flush``, once per message handled: the main reads them in the order the shard
produced them.
"""

from __future__ import annotations

import socket

from shadow_proxy.channel.stream import consume, stream_buffers
from shadow_proxy.exchange import DropReason
from shadow_proxy.worker import messages
from shadow_proxy.worker.sink import EncodedRecord

#: Buffers per ``sendmsg`` (below the kernel's IOV_MAX).
_IOV_MAX = 512


class Outbox:
    """What a shard sends to the main; a ``RecordSink`` across the shard boundary."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._out: list[bytes] = []
        #: Bit i: tap i got a record, drop or skip since ``touched`` was cleared.
        self.touched = 0
        #: A record, drop or skip went out since the last metrics report (which the
        #: main should relay with them: ``ShardLoop.run``).
        self.counted = False

    def send(self, message: messages.ShardMessage) -> None:
        self._out += stream_buffers(message.encode())[0]

    def flush(self) -> None:
        """Write what is buffered (blocking: the main reads its shards promptly)."""
        out, self._out = self._out, []
        while out:
            consume(out, self.sock.sendmsg(out[:_IOV_MAX]))

    # -- the RecordSink ---------------------------------------------------------

    def record(self, tap: int, record: EncodedRecord, ready_mono_ns: int) -> None:
        self.touched |= 1 << tap
        self.counted = True
        self.send(messages.Record(tap, ready_mono_ns, record))

    def drop(self, tap: int, reason: DropReason, count: int = 1) -> None:
        self.touched |= 1 << tap
        self.counted = True
        self.send(messages.Drop(tap, reason, count))

    def skip(self, tap: int, reason: str) -> None:
        self.touched |= 1 << tap
        self.counted = True
        self.send(messages.Skip(tap, reason))
