"""ZeroMQ CURVE for taps: encryption, and only the listed consumers read.

Runs in the tap worker at start-up, before any tap socket binds. A tap with
``curve`` (config: ``server_secret_key``, ``client_keys``) binds a CURVE
server socket with its own key pair and the ZAP domain of its name; a
consumer must present a key pair whose public key is in the tap's
``client_keys``, and know the tap's public key. Key files are the ones
``zmq.auth.create_certificates`` writes (``public-key = "..."`` and, in the
``.key_secret`` file, ``secret-key = "..."``).

Who answers the ZAP requests (the key checks during each consumer's
handshake): pyzmq's ``ThreadAuthenticator``, a thread of its own in the
worker. The worker's loop is one thread that may be busy for a while on one
request (a long prompt to tokenize); a handshake answered from that loop would
wait behind it, and the consumer would see a stalled connect. The ZAP thread
only looks a key up in a set per handshake and otherwise sleeps in a ZeroMQ
poll (the GIL released), so it costs the loop nothing measurable and keeps
handshakes independent of the loop's work.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import attrs
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from shadow_proxy.config import Config, CurveKeys

log = logging.getLogger(__name__)


class CurveKeyError(ValueError):
    """A tap's key file cannot be used; the message names the key's line."""


@attrs.frozen
class TapKeys:
    """One tap's CURVE material, loaded."""

    public: bytes
    secret: bytes
    #: Z85 public keys of the consumers allowed to subscribe.
    allowed: frozenset[bytes]


class AllowedKeys:
    """The ZAP credentials provider of one tap: a fixed set of public keys."""

    def __init__(self, allowed: frozenset[bytes]):
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.allowed


def load_tap_keys(curve: CurveKeys) -> TapKeys:
    """The tap's key pair and its allowed consumer keys (``OSError``/``ValueError``)."""
    public, secret = zmq.auth.load_certificate(curve.server_secret_key)
    if not secret:
        msg = f"{curve.server_secret_key} holds no secret-key (use the .key_secret file)"
        raise ValueError(msg)
    source = Path(curve.client_keys)
    if source.is_dir():
        names = sorted(p for p in os.listdir(source) if p.endswith(".key"))
        allowed = {zmq.auth.load_certificate(source / name)[0] for name in names}
    else:
        allowed = {zmq.auth.load_certificate(source)[0]}
    if not allowed:
        msg = f"{source} holds no public key (*.key files)"
        raise ValueError(msg)
    return TapKeys(public=public, secret=secret, allowed=frozenset(allowed))


def load_all(config: Config) -> dict[str, TapKeys]:
    """Every CURVE tap's keys by tap name; ``CurveKeyError`` naming the line."""
    keys = {}
    for tap in config.taps:
        if tap.curve is None:
            continue
        try:
            keys[tap.name] = load_tap_keys(tap.curve)
        except (OSError, ValueError) as e:
            where = config.where(f"taps[{tap.name}].curve")
            msg = f"{where}: tap '{tap.name}' CURVE keys cannot be read ({e})"
            raise CurveKeyError(msg) from e
    return keys


def start_authenticator(
    context: zmq.Context, keys: dict[str, TapKeys]
) -> ThreadAuthenticator | None:
    """The ZAP handler for the CURVE taps (one thread), or None without any."""
    if not keys:
        return None
    authenticator = ThreadAuthenticator(context, log=logging.getLogger(f"{__name__}.zap"))
    authenticator.start()
    for name, tap in keys.items():
        authenticator.configure_curve_callback(
            domain=name, credentials_provider=AllowedKeys(tap.allowed)
        )
    return authenticator


def make_server(socket: zmq.Socket, name: str, keys: TapKeys) -> None:
    """Set ``socket`` (before it binds) as the CURVE server of tap ``name``."""
    socket.setsockopt(zmq.ZAP_DOMAIN, name.encode())
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
