"""The control protocol, tap worker -> serving process: its messages. Pure.

The worker's main pushes these on its control socket; the supervisor
(``serving/supervisor.py``) decodes them and ``match``es on the class. On the
wire each is a MessagePack map with a ``kind``:

- ``Ready``: once, after the shards loaded their tokenizers, the tap sockets
  are bound and the hand-off connected: what does not change while the worker
  lives (each tap's ``TapInfo``: its configuration and where it publishes);
- ``Failed``: the worker cannot start; the text says why (a tokenizer, a socket);
- ``Snapshot``: every second and at shutdown, what changes: the worker's metric
  families (its main's and its shards', combined; absolute values) and each
  tap's ``TapCounters``, tagged with the worker's generation so that a report
  read after its worker died is still that worker's (``channel/families.py``).

``/shadow/taps`` shows each tap's ``TapInfo`` and latest ``TapCounters`` as one
map (``listing``): one shape, whichever message it came from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import msgpack

from shadow_proxy.channel.families import Family

#: After SIGTERM, how long the worker drains its tap queues before what is
#: left is lost (the supervisor waits this long, plus a margin, before SIGKILL).
DRAIN_S = 2.0


class ControlError(ValueError):
    """Bytes that are not a control message."""


@attrs.frozen
class TapInfo:
    """What ``/shadow/taps`` shows of a tap that does not change while the worker lives."""

    name: str
    topic: str
    #: Where its records are: the bound ZeroMQ endpoint, or ``jetstream://STREAM/SUBJECT``.
    endpoint: str
    capture: str
    curve: bool
    filters: tuple[str, ...]
    models: tuple[str, ...]
    sample: float
    capacity: int
    transport: str
    publisher_id: int
    #: The JetStream subject (``nats`` taps only).
    subject: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["filters"], out["models"] = list(self.filters), list(self.models)
        if self.subject is None:
            del out["subject"]
        return out


@attrs.frozen
class TapCounters:
    """A tap's counters now (SPEC 4's heartbeat has the same)."""

    next_seq: int = 0
    queued: int = 0
    published: int = 0
    dropped: dict[str, int] = attrs.field(factory=dict)
    skipped: dict[str, int] = attrs.field(factory=dict)
    publish_errors: int = 0
    queue_depth: int = 0


def listing(taps: Iterable[TapInfo], counters: Iterable[TapCounters]) -> list[dict[str, Any]]:
    """``/shadow/taps``: each tap's info and counters as one map (counters of a tap
    the worker has not reported yet are zeros)."""
    reported = list(counters)
    out = []
    for index, info in enumerate(taps):
        now = reported[index] if index < len(reported) else TapCounters()
        out.append({**info.as_json(), **attrs.asdict(now)})
    return out


@attrs.frozen
class Ready:
    taps: tuple[TapInfo, ...]
    kind = "ready"

    def fields(self) -> dict[str, Any]:
        return {"taps": [attrs.asdict(t) for t in self.taps]}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Ready:
        return cls(tuple(_tap_info(t) for t in fields["taps"]))


@attrs.frozen
class Failed:
    message: str
    kind = "error"

    def fields(self) -> dict[str, Any]:
        return {"message": self.message}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Failed:
        return cls(fields["message"])


@attrs.frozen
class Snapshot:
    #: The worker's generation (given by the serving process at spawn).
    generation: int
    families: list[Family]
    taps: tuple[TapCounters, ...]
    kind = "metrics"

    def fields(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "families": self.families,
            "taps": [attrs.asdict(t) for t in self.taps],
        }

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Snapshot:
        taps = tuple(TapCounters(**t) for t in fields["taps"])
        return cls(fields["generation"], fields["families"], taps)


ControlMessage = Ready | Failed | Snapshot


def _tap_info(fields: dict[str, Any]) -> TapInfo:
    return TapInfo(
        **{**fields, "filters": tuple(fields["filters"]), "models": tuple(fields["models"])}
    )


def encode(message: ControlMessage) -> bytes:
    return msgpack.packb({"kind": message.kind, **message.fields()})


def decode(data: bytes) -> ControlMessage:
    """The message in ``data``; ``ControlError`` when it is not one."""
    try:
        fields = msgpack.unpackb(data)
        cls = _BY_KIND[fields.pop("kind")]
        if set(fields) != {field.name for field in attrs.fields(cls)}:
            raise KeyError("fields")
        return cls.from_fields(fields)
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as e:
        msg = f"not a control message ({type(e).__name__})"
        raise ControlError(msg) from e


_BY_KIND: dict[str, type[Ready] | type[Failed] | type[Snapshot]] = {
    cls.kind: cls for cls in (Ready, Failed, Snapshot)
}
