"""The JetStream transport's configuration (SPEC section 9): the top-level ``nats``
section and the per-tap ``transport`` and ``subject`` keys.

Read by ``schema.py`` through the same strict ``Reader`` as every section: an
error names the file, line, key, expectation and value. ``nats`` is required
when a tap uses ``transport: nats``; ``subject`` is only allowed on such a tap
and ``endpoint`` only on a ZeroMQ one; subjects are literal NATS subjects,
unique, and none is another tap's heartbeat subject (``{subject}.heartbeat``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import attrs

from shadow_proxy.config import reader as checks
from shadow_proxy.config.reader import Reader
from shadow_proxy.config.values import MIB, TapConfig, Transport

GIB = 1024 * MIB
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
#: JetStream allows at most five replicas of a stream.
MAX_REPLICAS = 5
_SUBJECT_RE = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_-]+$")


class Discard(enum.StrEnum):
    """What a full stream does."""

    #: Drops its oldest messages.
    OLD = "old"
    #: Refuses new ones.
    NEW = "new"


@attrs.frozen
class NatsConfig:
    """Where ``nats`` taps publish: the servers and the stream they keep."""

    servers: tuple[str, ...]
    stream: str = "SHADOW"
    replicas: int = 1
    max_bytes: int = 8 * GIB
    max_age_s: float = 7 * 86400.0
    #: ``old``: a full stream drops its oldest messages; ``new``: refuses new ones.
    discard: Discard = attrs.field(default=Discard.OLD, converter=Discard)


def parse_tap_transport(
    reader: Reader, item: Mapping, prefix: str, topic: str
) -> tuple[Transport, str | None]:
    """A tap's ``transport`` and ``subject`` (``subject`` only for ``nats``)."""
    transport = Transport(
        reader.get(item, "transport", prefix, str, "zmq", checks.choice(*Transport))
    )
    if transport is Transport.ZMQ:
        if "subject" in item:
            expected = "is only allowed with transport: nats (transport is 'zmq')"
            reader.fail(item, f"{prefix}subject", expected, item["subject"])
        return transport, None
    if "endpoint" in item:
        expected = "is only allowed with transport: zmq (transport is 'nats')"
        reader.fail(item, f"{prefix}endpoint", expected, item["endpoint"])
    subject = reader.get(item, "subject", prefix, str, f"shadow.{topic}", nats_subject)
    return transport, subject


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
    keys = {"servers", "stream", "replicas", "max_bytes", "max_age_s", "discard"}
    s = reader.section(root, "nats", "", keys)
    p = "nats."
    servers = s.get("servers")
    if not isinstance(servers, list) or not servers:
        expected = "is required: a list of at least one NATS server URL"
        reader.fail(s, f"{p}servers", expected, *(() if servers is None else (servers,)))
    for server in servers:
        problem = nats_url(server) if isinstance(server, str) else "must list URLs"
        if problem:
            reader.fail(s, f"{p}servers", problem, server)
    config = NatsConfig(
        servers=tuple(servers),
        stream=reader.get(s, "stream", p, str, "SHADOW", stream_name),
        replicas=reader.get(s, "replicas", p, int, 1, replicas),
        max_bytes=reader.get(s, "max_bytes", p, int, 8 * GIB, checks.at_least_1),
        max_age_s=reader.get(s, "max_age_s", p, float, 7 * 86400.0, checks.positive),
        discard=Discard(reader.get(s, "discard", p, str, "old", checks.choice(*Discard))),
    )
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


# -- checks: None when the value is fine, else what is expected ---------------------


def nats_subject(value: str) -> str | None:
    if _SUBJECT_RE.match(value):
        return None
    return "must be a NATS subject: dot-separated tokens, no spaces and no wildcards (* or >)"


def nats_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in NATS_SCHEMES or not parts.hostname:
        return "must be a NATS server URL such as nats://host:4222"
    return None


def stream_name(value: str) -> str | None:
    return None if _STREAM_RE.match(value) else "must match [A-Za-z0-9_-]+"


def replicas(value: int) -> str | None:
    return None if 1 <= value <= MAX_REPLICAS else f"must be between 1 and {MAX_REPLICAS}"
