"""Building and reading responses for the recorder's tests: SSE bodies, chunks fed to a
recorder, records built with a stand-in tokenizer (one id per character)."""

from __future__ import annotations

import json
from typing import Any

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.observed import ObservedResponse
from shadow_proxy.worker.response.recorder import ResponseRecorder

SSE = "text/event-stream"


JSON = "application/json"


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character."""
    return [ord(c) for c in text]


def chat(
    content: str | None = None,
    *,
    index: int = 0,
    finish: str | None = None,
    rid: str = "chatcmpl-7",
    **delta: Any,
) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk", "choices": [choice]}


def comp(text: str = "", *, index: int = 0, finish: str | None = None, **extra: Any) -> dict:
    choice = {"index": index, "text": text, "finish_reason": finish, **extra}
    return {"id": "cmpl-3", "object": "text_completion", "choices": [choice]}


def sse(*objs: dict[str, Any] | str, done: bool = True, eol: str = "\n") -> bytes:
    parts = [f"data: {o if isinstance(o, str) else json.dumps(o)}{eol}{eol}" for o in objs]
    if done:
        parts.append(f"data: [DONE]{eol}{eol}")
    return "".join(parts).encode()


def observe(
    *chunks: bytes,
    route: Route = Route.CHAT,
    n: int = 1,
    status: int | None = 200,
    ctype: str = SSE,
    encoding: str = "",
    end: EndKind = EndKind.CLEAN,
    detail: str = "",
    chunk_timing: bool = True,
    **caps: Any,
) -> ObservedResponse:
    """Feed ``chunks`` at offsets 10, 20, ... ns; end at 1000."""
    recorder = ResponseRecorder(route, n, chunk_timing=chunk_timing, **caps)
    if status is not None:
        recorder.head(status, ctype, encoding, 5)
    for i, chunk in enumerate(chunks, 1):
        recorder.feed(chunk, 10 * i)
    return recorder.finish(end, 1000, detail)


def record(observed: ObservedResponse, **options: Any) -> dict[str, Any]:
    opts = {"tokens": True, "text": True, "max_tokens": None, "chunk_timing": True, **options}
    return observed.to_record(encode, **opts)


def has_none(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(has_none(v) for v in value.values())
    if isinstance(value, list):
        return any(has_none(v) for v in value)
    return False


CHAT_STREAM = [
    sse(chat(role="assistant", content="")),
    sse(chat("Hel"), chat("lo ")),
    sse(chat("wörld"), chat(finish="stop")),
    sse(
        {
            "id": "chatcmpl-7",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "prompt_tokens_details": None},
        }
    ),
]
