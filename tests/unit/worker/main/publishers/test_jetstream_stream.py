"""The stream the ``nats`` taps publish to: NATS subject matching (pure), the
stream the proxy creates, and ``ensure_stream`` against a real nats-server
(created, found covering, found not covering, refused, no answer)."""

from __future__ import annotations

import nats
import nats.errors
import pytest
from nats.js import api

from shadow_proxy.config.nats import NatsConfig
from shadow_proxy.worker.main.publishers.jetstream_stream import (
    DUPLICATE_WINDOW_S,
    stream_config,
    subject_matches,
    uncovered,
)

pytestmark = pytest.mark.timeout(60)

SUBJECTS = ["shadow.kv", "shadow.kv.heartbeat"]


class TestSubjects:
    """``*`` is one token, ``>`` one or more trailing tokens."""

    @pytest.mark.parametrize(
        ("pattern", "subject", "covered"),
        [
            ("shadow.>", "shadow.kv", True),
            ("shadow.>", "shadow.kv.heartbeat", True),
            ("shadow.>", "shadow", False),
            ("shadow.*", "shadow.kv", True),
            ("shadow.*", "shadow.kv.heartbeat", False),
            ("shadow.*.heartbeat", "shadow.kv.heartbeat", True),
            ("shadow.kv", "shadow.kv", True),
            ("shadow.kv", "shadow.kvx", False),
            ("shadow.kv", "shadow", False),
            (">", "a.b", True),
        ],
    )
    def test_matches(self, pattern: str, subject: str, covered: bool) -> None:
        assert subject_matches(pattern, subject) is covered

    def test_uncovered_in_order(self) -> None:
        subjects = ["other.b", "shadow.a", "other.a"]
        assert uncovered(["shadow.>"], subjects) == ["other.b", "other.a"]
        assert uncovered(["shadow.>", "other.*"], subjects) == []

    def test_created_stream(self) -> None:
        config = NatsConfig(
            servers=("nats://x",), replicas=3, max_bytes=1024, max_age_s=60.0, discard="new"
        )
        created = stream_config(config, ["shadow.kv", "logs.kv", "logs.kv.heartbeat"])
        assert created.subjects == ["shadow.>", "logs.kv", "logs.kv.heartbeat"]
        assert (created.num_replicas, created.max_bytes, created.max_age) == (3, 1024, 60.0)
        assert created.discard == api.DiscardPolicy.NEW
        assert created.storage == api.StorageType.FILE
        assert created.duplicate_window == DUPLICATE_WINDOW_S


async def _connect(url: str) -> nats.NATS | None:
    """A connection to ``url``, or None while nothing answers there."""
    try:
        return await nats.connect(url, connect_timeout=1, allow_reconnect=False)
    except (nats.errors.Error, OSError, TimeoutError):
        return None
