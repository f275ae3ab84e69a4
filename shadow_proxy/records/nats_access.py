"""How a process proves itself to NATS: one credential kind and TLS (issue 31). Pure.

``NatsAccess`` is what the proxy's ``nats.auth`` / ``nats.tls`` keys and the
readers' ``--nats-*`` flags both become: user and password, a token, an NKey
seed, or a ``.creds`` file (JWT and NKey seed, as ``nsc`` writes them), and TLS
with a CA file and an optional client certificate and key (mutual TLS).

Secrets are never values: they come from files (or, in the proxy's
configuration, environment variables named there) and are read only when a
connection is made (``connect_options``), so a rotated Secret is picked up by
the next connection. Nothing here puts a secret in a message: ``describe`` names
the kind and the file, ``redact`` removes the userinfo of a URL
(``nats://user:pass@host``) before it is shown anywhere.
"""

from __future__ import annotations

import argparse
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.records.errors import SourceError

#: How long a reader may take to reach a server before it gives up (exit 2).
DEFAULT_CONNECT_BUDGET_S = 10.0


@attrs.frozen
class NatsAccess:
    """One credential kind (or none: an open server) and TLS."""

    user: str | None = None
    password_file: Path | None = None
    password_env: str | None = None
    token_file: Path | None = None
    token_env: str | None = None
    nkey_file: Path | None = None
    creds_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    #: Where the environment variables are looked up (the process's by default).
    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ, eq=False, repr=False)

    def problem(self) -> str | None:
        """What is wrong with the combination, or None."""
        password = self.password_file is not None or self.password_env is not None
        token = self.token_file is not None or self.token_env is not None
        kinds = [
            name
            for name, given in (
                ("user", self.user is not None or password),
                ("token", token),
                ("nkey", self.nkey_file is not None),
                ("creds", self.creds_file is not None),
            )
            if given
        ]
        if len(kinds) > 1:
            return f"give one credential kind, not {' and '.join(kinds)}"
        if self.password_file is not None and self.password_env is not None:
            return "give the password from a file or from the environment, not both"
        if self.token_file is not None and self.token_env is not None:
            return "give the token from a file or from the environment, not both"
        if password and self.user is None:
            return "a password needs a user"
        if self.user is not None and not password:
            return "a user needs a password (a file or an environment variable)"
        if (self.cert_file is None) != (self.key_file is None):
            return "a client certificate needs its key (and the key its certificate)"
        return None

    @property
    def tls(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def describe(self) -> str:
        """The kind and where it comes from, never the secret."""
        if self.user is not None:
            where = self.password_file or f"${self.password_env}"
            kind = f"user {self.user} (password from {where})"
        elif self.token_file is not None or self.token_env is not None:
            kind = f"token from {self.token_file or '$' + str(self.token_env)}"
        elif self.nkey_file is not None:
            kind = f"NKey seed {self.nkey_file}"
        elif self.creds_file is not None:
            kind = f"credentials {self.creds_file}"
        else:
            kind = "no credentials"
        return kind + (", TLS" if self.tls else "")

    def connect_options(self) -> dict[str, Any]:
        """The NATS client's connect keywords; the secrets are read now.
        ``SourceError`` names a file or variable that cannot be read."""
        problem = self.problem()
        if problem is not None:
            raise SourceError(f"NATS credentials: {problem}")
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self._secret(self.password_file, self.password_env, "password")
        elif self.token_file is not None or self.token_env is not None:
            options["token"] = self._secret(self.token_file, self.token_env, "token")
        elif self.nkey_file is not None:
            options["nkeys_seed_str"] = self._secret(self.nkey_file, None, "NKey seed")
        elif self.creds_file is not None:
            self._secret(self.creds_file, None, "credentials")  # readable now, not at connect
            options["user_credentials"] = str(self.creds_file)
        if self.tls:
            options["tls"] = self.ssl_context()
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server against ``ca_file`` (the
        system's CAs without one), with the client certificate when given."""
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as e:
            msg = f"NATS TLS files ({self.ca_file}, {self.cert_file}, {self.key_file}): {e}"
            raise SourceError(msg) from e
        return context

    def _secret(self, path: Path | None, env: str | None, what: str) -> str:
        if env is not None:
            value = self.environ.get(env)
            if not value:
                msg = f"NATS {what}: environment variable {env} is not set"
                raise SourceError(msg)
            return value.strip()
        assert path is not None
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            msg = f"NATS {what} file {path}: {getattr(e, 'strerror', None) or type(e).__name__}"
            raise SourceError(msg) from e
        if not value:
            msg = f"NATS {what} file {path} is empty"
            raise SourceError(msg)
        return value


def redact(url: str) -> str:
    """``url`` without its userinfo (``nats://user:secret@host`` -> ``nats://host``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def redact_all(servers: list[str]) -> str:
    return ",".join(redact(url) for url in servers)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The readers' credential and TLS flags (files only: no secret on a command line)."""
    group.add_argument("--nats-user", metavar="USER", help="JetStream: user (with a password file)")
    group.add_argument("--nats-password-file", metavar="FILE", type=Path, help="its password")
    group.add_argument("--nats-token-file", metavar="FILE", type=Path, help="JetStream: a token")
    group.add_argument("--nats-nkey", metavar="FILE", type=Path, help="JetStream: an NKey seed")
    group.add_argument(
        "--nats-creds", metavar="FILE", type=Path, help="JetStream: a .creds file (JWT + NKey)"
    )
    group.add_argument(
        "--nats-ca", metavar="FILE", type=Path, help="JetStream TLS: the CA that signed the servers"
    )
    group.add_argument("--nats-cert", metavar="FILE", type=Path, help="mutual TLS: certificate")
    group.add_argument("--nats-key", metavar="FILE", type=Path, help="mutual TLS: its key")
    group.add_argument(
        "--nats-connect-budget",
        type=float,
        default=DEFAULT_CONNECT_BUDGET_S,
        metavar="S",
        help="JetStream: give up (exit 2) when no server answers within S "
        f"[{DEFAULT_CONNECT_BUDGET_S:.0f}]",
    )


def from_arguments(args: argparse.Namespace) -> NatsAccess:
    """The access the parsed flags name; ``SourceError`` when they do not fit."""
    access = NatsAccess(
        user=getattr(args, "nats_user", None),
        password_file=getattr(args, "nats_password_file", None),
        token_file=getattr(args, "nats_token_file", None),
        nkey_file=getattr(args, "nats_nkey", None),
        creds_file=getattr(args, "nats_creds", None),
        ca_file=getattr(args, "nats_ca", None),
        cert_file=getattr(args, "nats_cert", None),
        key_file=getattr(args, "nats_key", None),
    )
    problem = access.problem()
    if problem is not None:
        raise SourceError(f"--nats-* flags: {problem}")
    return access
