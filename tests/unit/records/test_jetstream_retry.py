"""The backoff through an outage: doubling to its bound, one line when it starts
and one when it ends, every retry counted; the outage said in words."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from shadow_proxy.records import jetstream_retry
from shadow_proxy.records.jetstream_retry import Retrier


async def test_one_line_each_way_and_counted(monkeypatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(jetstream_retry.asyncio, "sleep", sleep)
    lines: list[str] = []
    retrier = Retrier("stream 'SHADOW'", lines.append)
    for _ in range(7):
        await retrier.failed(nats.js.errors.ServiceUnavailableError())
    retrier.recovered()
    retrier.recovered()
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert retrier.retries == 7
    assert len(lines) == 2
    assert lines[0].startswith("stream 'SHADOW' not answering (503, no leader)")
    assert lines[1].startswith("stream 'SHADOW' answering again after")
    await retrier.failed(nats.errors.NoRespondersError())  # a new outage: from 0.1 again
    assert waits[-1] == 0.1 and len(lines) == 3


@pytest.mark.parametrize(
    ("error", "word"),
    [
        (nats.js.errors.ServiceUnavailableError(), "503, no leader"),
        (nats.errors.NoRespondersError(), "no responders"),
        (nats.errors.ConnectionReconnectingError(), "reconnecting"),
        (nats.errors.TimeoutError(), "no answer"),
    ],
)
def test_outage_words(error: BaseException, word: str) -> None:
    assert jetstream_retry.outage_word(error) == word
