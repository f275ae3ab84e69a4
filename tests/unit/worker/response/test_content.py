"""What a response's events say: a data event's bytes (the fast path) are read as
the dispatched event with the same data is."""

from __future__ import annotations

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.choices import ChoiceTable
from shadow_proxy.worker.response.content import BodyContent
from shadow_proxy.worker.response.sse import SSEEvent
from tests.support import ROOT

CAPTURES = ROOT / "tests" / "data" / "dynamo"


def content(route: Route = Route.CHAT) -> BodyContent:
    table = ChoiceTable(
        max_text_bytes_per_choice=1 << 16,
        max_text_bytes_total=1 << 16,
        max_token_ids_per_choice=64,
        max_token_ids_total=64,
        max_choices=4,
    )
    return BodyContent(route, table, chunk_timing=True, max_chunk_offsets=4)


def seen(body: BodyContent) -> tuple:
    return (
        body.choices.observed(),
        body.upstream_id,
        body.usage,
        body.error,
        (body.first, body.last, list(body.offsets), body.dropped_offsets),
        body.malformed,
        body.done,
    )


@pytest.mark.parametrize(
    ("name", "route"),
    [
        ("chat_stream_usage.sse", Route.CHAT),
        ("completions_stream_usage.sse", Route.COMPLETIONS),
        ("chat_stream_mocker_killed.sse", Route.CHAT),
    ],
)
def test_data_bytes_as_the_event(name: str, route: Route) -> None:
    datas = [
        line.removeprefix(b"data: ")
        for line in (CAPTURES / name).read_bytes().split(b"\n")
        if line.startswith(b"data: ")
    ]
    datas += [b"{not json", b"[1]", b'{"choices":[{"index":0,"delta":{"content":"\xff"}}]}']
    fast, slow = content(route), content(route)
    for offset, data in enumerate(datas):
        fast.data(data, offset)
        slow.event(SSEEvent(data.decode("utf-8", "replace")), offset)
    assert seen(fast) == seen(slow)
    assert (fast.done and fast.usage is not None) or name.endswith("killed.sse")
    assert fast.malformed == 2
    assert len(fast.offsets) == 4 and fast.dropped_offsets > 0


def test_error_event_and_named_events() -> None:
    body = content()
    body.event(SSEEvent("", "error", comments=("worker died",)), 1)
    body.event(SSEEvent('{"choices":[{"index":0,"delta":{"content":"x"}}]}', "note"), 2)
    assert body.error is not None and "worker died" in body.error
    assert body.choices.observed() == () and body.first is None
