"""The outcome rules (SPEC section 3, "Response") and the error text a body carries.

Pure. ``decide`` turns how the exchange ended (the serving loop's ``EndKind``)
and what the response showed into ``complete``, ``incomplete``, ``cancelled``
or ``error`` with its message, in this order of precedence: the client went
away; the capture was lost; an error status; an error event or body; a broken,
timed-out, failed or shut-down exchange; a choice that finished with an error
reason; every requested choice finished (complete) or not (incomplete).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shadow_proxy.exchange import EndKind

OUTCOMES = ("complete", "incomplete", "cancelled", "error")
MAX_ERROR_CHARS = 512

#: Default error messages for ends that are errors whatever the body said.
END_ERRORS = {
    EndKind.UPSTREAM_BROKEN: "upstream connection broke",
    EndKind.TIMEOUT: "upstream read timed out",
    EndKind.UPSTREAM_FAILED: "upstream request failed",
    EndKind.SHUTDOWN: "proxy shut down",
}
#: Finish reasons that end a choice without finishing it (not errors).
ABORTED = frozenset({"abort", "cancelled", "canceled"})


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_error_reason(reason: str) -> bool:
    return reason == "error" or reason.startswith("error:")


def error_message(obj: Any, *, detail: bool = False) -> str | None:
    """The error a JSON body or event carries, or None. ``detail`` also accepts
    FastAPI's ``{"detail": ...}`` and a bare ``{"message": ...}`` (Dynamo's
    error bodies, OpenAI's error events); only meaningful on an error status or
    in an error event."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        message = err.get("message")
        if isinstance(message, str) and message:
            return clip(message)
        return clip(json.dumps(err, ensure_ascii=False))
    if isinstance(err, str) and err:
        return clip(err)
    if obj.get("object") == "error":
        message = obj.get("message")
        return clip(message if isinstance(message, str) else json.dumps(obj))
    if detail and "detail" in obj:
        value = obj["detail"]
        return clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    if detail and isinstance(obj.get("message"), str) and obj["message"]:
        return clip(obj["message"])  # Dynamo's error bodies, OpenAI's error events
    return None


def decide(
    end: EndKind,
    detail: str,
    *,
    status: int | None,
    error: str | None,
    finished: Sequence[tuple[int, str | None]],
    n: int,
    problem: str | None,
) -> tuple[str, str | None]:
    """The outcome and its message.

    ``finished`` holds ``(index, finish_reason)`` per choice seen, sorted by
    index; ``n`` is how many choices were requested; ``problem`` says why the
    body could not be read in full ("" when it could not be decoded at all).
    """
    if end is EndKind.CLIENT_GONE:
        return "cancelled", error
    if end is EndKind.CAPTURE_LOST:
        return "error", error or ("capture lost: " + detail if detail else "capture lost")
    if status is not None and status >= 400:
        if error is None and end in END_ERRORS and detail:
            error = clip(detail)  # the proxy answered itself: say why
        return "error", error or f"HTTP {status}"
    if error is not None:
        return "error", error
    if end in END_ERRORS:
        return "error", clip(detail) if detail else END_ERRORS[end]
    for index, reason in finished:
        if reason is not None and is_error_reason(reason):
            return "error", f"choice {index} finished with {reason!r}"
    reasons = dict(finished)
    complete = all(reasons.get(i) is not None and reasons[i] not in ABORTED for i in range(n))
    if complete and problem is None:
        return "complete", None
    return "incomplete", problem or None


def event_error(data: str, comments: Sequence[str]) -> str:
    """The message of an SSE ``event: error``: its data's error (JSON), else its data
    or comments as they are, clipped."""
    message = None
    if data:
        try:
            message = error_message(json.loads(data), detail=True)
        except ValueError:
            message = clip(data)
        if message is None:
            message = clip(data)
    elif comments:
        message = clip(" -- ".join(comments))
    return message or "error event"
