"""The errors a record source raises: each is one line for its user (a tool
prints it and exits 2), and none carries a secret (URLs are shown without
their userinfo, credentials by file name only). Pure."""

from __future__ import annotations


class SourceError(ValueError):
    """The source arguments name no readable source; the message says why."""


class NatsRefused(SourceError):
    """A NATS server answered and refused: authorization, TLS verification,
    permissions, a stream JetStream will not create. Trying again does not help."""


class NatsUnreachable(SourceError):
    """No NATS server answered within the connect budget."""
