"""The JetStream transport's configuration (SPEC section 9): the top-level ``nats``
section; the per-tap ``transport`` and ``subject`` keys are ``TapConfig``'s.

Each key is defined once, as a ``NatsConfig`` field (``keys.key``), and read by the
same strict ``Reader`` as every section: an error names the file, line, key,
expectation and value. ``nats`` is required when a tap uses ``transport: nats``;
subjects are unique, and none is another tap's heartbeat subject
(``{subject}.heartbeat``). A key added here (``nats.auth``, ``nats.tls``: a nested
value class) is read, documented and shown in the example from its field alone.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence

import attrs

from shadow_proxy.config import reader as checks
from shadow_proxy.config.choices import Transport
from shadow_proxy.config.keys import key
from shadow_proxy.config.reader import Reader
from shadow_proxy.config.values import MIB, TapConfig

GIB = 1024 * MIB
#: JetStream allows at most five replicas of a stream.
MAX_REPLICAS = 5
_STREAM_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_SERVERS = "is required: a list of at least one NATS server URL"


class Discard(enum.StrEnum):
    """What a full stream does."""

    #: Drops its oldest messages.
    OLD = "old"
    #: Refuses new ones.
    NEW = "new"


def servers_check(value: Sequence[object]) -> str | None:
    if not value:
        return _SERVERS
    for server in value:
        problem = checks.nats_url(server) if isinstance(server, str) else "must list URLs"
        if problem:
            return problem
    return None


def stream_name(value: str) -> str | None:
    return None if _STREAM_RE.match(value) else "must match [A-Za-z0-9_-]+"


def replicas(value: int) -> str | None:
    return None if 1 <= value <= MAX_REPLICAS else f"must be between 1 and {MAX_REPLICAS}"


@attrs.frozen
class NatsConfig:
    """Where ``nats`` taps publish: the servers and the stream they keep."""

    servers: tuple[str, ...] = key(
        "The NATS servers' URLs (nats://, tls://, ws://, wss://).",
        check=servers_check,
        required=_SERVERS,
        expected=_SERVERS,
        example=("nats://127.0.0.1:4222",),
    )
    stream: str = key(
        "The stream (subjects shadow.>), created at start-up if it does not exist.",
        "SHADOW",
        check=stream_name,
    )
    replicas: int = key("The stream's replicas (JetStream: at most 5).", 1, check=replicas)
    max_bytes: int = key(
        "The stream's size bound (its discard policy applies past it).",
        8 * GIB,
        check=checks.at_least_1,
    )
    max_age_s: float = key(
        "How long the stream keeps a record.", 7 * 86400.0, check=checks.positive
    )
    #: ``old``: a full stream drops its oldest messages; ``new``: refuses new ones.
    discard: Discard = key(
        "old: a full stream drops its oldest messages; new: it refuses new ones.",
        Discard.OLD,
        converter=Discard,
    )


def parse_nats_section(
    reader: Reader, root: Mapping, taps: tuple[TapConfig, ...]
) -> NatsConfig | None:
    """The top-level ``nats`` section; required when a tap publishes to NATS."""
    users = [tap for tap in taps if tap.transport is Transport.NATS]
    if root.get("nats") is None:
        if users:
            expected = f"is required when a tap uses transport: nats (tap '{users[0].name}')"
            reader.fail(root, "nats", expected)
        return None
    section = reader.section(root, "nats", "", {f.name for f in attrs.fields(NatsConfig)})
    config = reader.read(NatsConfig, section, "nats.")
    items = root.get("taps") or []
    seen: dict[str, str] = {}
    for tap, item in zip(taps, items, strict=True):
        if tap.subject is None:
            continue
        name = f"taps[{tap.name}].subject"
        beat = tap.subject + ".heartbeat"
        if tap.subject in seen:
            reader.fail(item, name, "must be unique across taps", tap.subject)
        for other, owner in seen.items():
            if beat == other or other + ".heartbeat" == tap.subject:
                expected = f"must not be, or have as its heartbeat subject, tap '{owner}'s"
                reader.fail(item, name, expected, tap.subject)
        seen[tap.subject] = tap.name
    return config
