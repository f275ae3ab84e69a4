"""The JetStream transport's configuration (SPEC section 9): the top-level ``nats``
section; the per-tap ``transport`` and ``subject`` keys are ``TapConfig``'s.

Each key is defined once, as a ``NatsConfig`` field (``keys.key``), and read by the
same strict ``Reader`` as every section: an error names the file, line, key,
expectation and value. ``nats`` is required when a tap uses ``transport: nats``;
subjects are unique, and none is another tap's heartbeat subject
(``{subject}.heartbeat``). ``nats.auth`` and ``nats.tls`` (nested value classes)
say how the proxy proves itself (issue 31): one credential kind, its secret in
a file or an environment variable named here (never the secret itself), and
the CA, certificate and key files; paths are relative to the file's directory.
They become a ``records.nats_access.NatsAccess`` (``NatsConfig.access``), the
readers' ``--nats-*`` flags' value too.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.config import reader as checks
from shadow_proxy.config.choices import Transport
from shadow_proxy.config.keys import key
from shadow_proxy.config.reader import Reader
from shadow_proxy.config.values import MIB, TapConfig
from shadow_proxy.records.nats_access import NatsAccess

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


def _path(value: str | None, context: Any) -> str | None:
    return None if value is None else str(context.local_path(value))


def _env_name(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) else "must be a variable name"


@attrs.frozen
class NatsAuth:
    """One credential kind: user and password, a token, an NKey seed, or a .creds file."""

    user: str | None = key("The NATS user (with password_file or password_env).", None)
    password_file: str | None = key(
        "A file holding the user's password (a mounted Secret).", None, parse=_path
    )
    password_env: str | None = key(
        "An environment variable holding the user's password.", None, check=_env_name
    )
    token_file: str | None = key("A file holding a token.", None, parse=_path)
    token_env: str | None = key("An environment variable holding a token.", None, check=_env_name)
    nkey_file: str | None = key("A file holding an NKey seed (SU...).", None, parse=_path)
    creds_file: str | None = key(
        "A .creds file (JWT and NKey seed, as nsc writes it).",
        None,
        parse=_path,
        example="secrets/proxy.creds",
    )


@attrs.frozen
class NatsTls:
    """TLS to the servers: the CA that signed them, and a client certificate for mutual TLS."""

    ca_file: str | None = key(
        "The CA file the servers' certificates are checked against.",
        None,
        parse=_path,
        example="secrets/ca.pem",
    )
    cert_file: str | None = key("The client certificate (mutual TLS).", None, parse=_path)
    key_file: str | None = key("The client certificate's key.", None, parse=_path)


def _file(value: str | None) -> Path | None:
    return None if value is None else Path(value)


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
    auth: NatsAuth | None = key(
        "How the proxy proves itself: one credential kind, secrets in files or variables.",
        None,
    )
    tls: NatsTls | None = key("TLS to the servers (also implied by tls:// URLs).", None)

    def access(self) -> NatsAccess:
        """The credentials and TLS as the NATS connection takes them."""
        auth, tls = self.auth or NatsAuth(), self.tls or NatsTls()
        return NatsAccess(
            user=auth.user,
            password_file=_file(auth.password_file),
            password_env=auth.password_env,
            token_file=_file(auth.token_file),
            token_env=auth.token_env,
            nkey_file=_file(auth.nkey_file),
            creds_file=_file(auth.creds_file),
            ca_file=_file(tls.ca_file),
            cert_file=_file(tls.cert_file),
            key_file=_file(tls.key_file),
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
    config = reader.read(NatsConfig, section, "nats.", context=reader)
    problem = config.access().problem()
    if problem is not None:
        where = "nats.tls" if "certificate" in problem else "nats.auth"
        reader.fail(section, where, problem)
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
