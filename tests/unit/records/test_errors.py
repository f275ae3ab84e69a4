"""A NATS refusal or outage is a SourceError: every tool already prints a
SourceError as one line and exits 2."""

from __future__ import annotations

from shadow_proxy.records.errors import NatsRefused, NatsUnreachable, SourceError


def test_nats_errors_are_source_errors() -> None:
    assert issubclass(NatsRefused, SourceError)
    assert issubclass(NatsUnreachable, SourceError)
    assert not issubclass(NatsRefused, NatsUnreachable)
