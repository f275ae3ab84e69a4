"""Control messages, tap worker -> serving process: one owner for the protocol.

The worker pushes these on its control socket; the supervisor
(``serving/supervisor.py``) reads them. Each is an attrs value with a named
kind on the wire (a MessagePack map with ``kind``), so neither side builds or
parses dicts by hand:

- ``Ready``: the worker loaded its tokenizers and bound its tap sockets; sent
  once, before any hand-off message is read.
- ``Failed``: the worker cannot start; the text says why (a tokenizer, a socket).
- ``Snapshot``: every second, the worker's metric families (its main's and its
  shards', summed) and tap listing.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgpack

#: After SIGTERM, how long the worker drains its tap queues before what is
#: left is lost (the supervisor waits this long, plus a margin, before SIGKILL).
DRAIN_S = 2.0

#: A metric family as plain data: name, type, documentation and samples
#: ``[sample_name, labels, value]``.
Family = list[Any]


class ControlError(ValueError):
    """Bytes that are not a control message."""


@attrs.frozen
class Ready:
    taps: list[dict[str, Any]]
    kind = "ready"


@attrs.frozen
class Failed:
    message: str
    kind = "error"


@attrs.frozen
class Snapshot:
    families: list[Family]
    taps: list[dict[str, Any]]
    kind = "metrics"


ControlMessage = Ready | Failed | Snapshot


def encode(message: ControlMessage) -> bytes:
    fields = attrs.asdict(message, recurse=False)
    return msgpack.packb({"kind": message.kind, **fields})


def decode(data: bytes) -> ControlMessage:
    """The message in ``data``; ``ControlError`` when it is not one."""
    try:
        fields = msgpack.unpackb(data)
        kind = fields.pop("kind")
        cls = _BY_KIND[kind]
        return cls(**fields)
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as e:
        msg = f"not a control message ({type(e).__name__})"
        raise ControlError(msg) from e


_BY_KIND: dict[str, type] = {cls.kind: cls for cls in (Ready, Failed, Snapshot)}
