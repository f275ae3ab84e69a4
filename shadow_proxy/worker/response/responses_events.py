"""A Responses API answer, read as the client received it: typed stream events or
the unary ``response`` object.

Pure. The recorder (``recorder.py``) hands a ``ResponsesReader`` each SSE event
of a ``/v1/responses`` stream (``event``) or the parsed unary body (``body``),
and takes the facts back when the exchange ends. A Responses request is one
generation (``n`` = 1), so its output is choice 0 of the ``ChoiceTable``: every
output item's text in order (message ``output_text`` and ``refusal``, function
call name and arguments, reasoning text and summaries), as the chat recorder
keeps a choice's content, reasoning and tool calls.

The terminal status becomes the finish reason a chat choice would carry, so that
records of both routes read alike (Dynamo makes the Responses status from the
chat finish reason): ``completed`` -> ``stop`` (``tool_calls`` when the output
holds function calls), ``incomplete`` with ``max_output_tokens`` -> ``length``,
with ``content_filter`` -> ``content_filter`` (any other reason as it is),
``cancelled`` -> ``cancelled``. ``failed`` sets no finish reason but the error
(``response.error.message``), as does an ``error`` event; the outcome rules
(``outcome.py``) then apply unchanged: complete, incomplete, cancelled, error.

Events read (Dynamo 1.6.1 and OpenAI shapes): ``response.created`` /
``in_progress`` (the id), ``response.output_item.added`` (a function call's
name), the ``*.delta`` events of output text, refusals, function-call
arguments, reasoning text and summaries (output, and the time of each),
``response.completed`` / ``incomplete`` / ``failed`` / ``cancelled`` (status,
usage, error; their ``output`` stands in for a stream that sent no deltas),
``error``, and ``[DONE]``. Other events (``*.done``, content parts) repeat what
the deltas said and are skipped.
"""

from __future__ import annotations

import json
from typing import Any

from shadow_proxy.worker.response.choices import Choice, ChoiceTable
from shadow_proxy.worker.response.outcome import clip

MAX_ID_CHARS = 256

#: Delta events whose ``delta`` is output text.
DELTA_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    }
)
#: Events that end the response, with its final state.
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)
#: ``incomplete_details.reason`` -> the chat finish reason.
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}


class ResponsesReader:
    """What one Responses answer showed: output text (choice 0 of ``choices``),
    the response id, the last usage, the first error, the finish reason, and
    events whose data was not usable."""

    __slots__ = ("calls", "choices", "done", "error", "malformed", "response_id", "usage")

    def __init__(self, choices: ChoiceTable) -> None:
        self.choices = choices
        self.response_id: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.malformed = 0
        self.done = False
        #: Function calls seen in the output (``completed`` then means ``tool_calls``).
        self.calls = False

    # -- the two entries ---------------------------------------------------------

    def event(self, name: str, data: str) -> bool:
        """One SSE event (its ``event`` field and data). True when it carried output."""
        if data == "[DONE]":
            self.done = True
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            if name == "error":
                self._set_error(clip(data) if data else "error event")
            else:
                self.malformed += 1
            return False
        if not isinstance(obj, dict):
            self.malformed += 1
            return False
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = name
        if kind in DELTA_EVENTS:
            return self._text(obj.get("delta"))
        if kind == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                self.calls = True
                return self._text(item.get("name"))
            return False
        if kind == "error" or name == "error":
            self._set_error(_error_text(obj) or clip(data))
            return False
        response = obj.get("response")
        if isinstance(response, dict):
            self._response_id(response)
            if kind in TERMINAL_EVENTS:
                return self._final(response, stream=True)
        return False

    def body(self, obj: dict[str, Any]) -> bool:
        """The unary ``response`` object. True when it carried output."""
        self._response_id(obj)
        return self._final(obj, stream=False)

    # -- pieces ------------------------------------------------------------------

    def _choice(self) -> Choice | None:
        return self.choices.get(0)

    def _text(self, piece: Any) -> bool:
        if not isinstance(piece, str) or not piece:
            return False
        choice = self._choice()
        if choice is None:
            return False
        self.choices.add_text(choice, piece)
        choice.content_chunks += 1
        return True

    def _response_id(self, response: dict[str, Any]) -> None:
        rid = response.get("id")
        if self.response_id is None and isinstance(rid, str) and rid:
            self.response_id = rid[:MAX_ID_CHARS]

    def _set_error(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def _final(self, response: dict[str, Any], *, stream: bool) -> bool:
        """The response's end state: usage, error, finish reason; its output when
        the stream sent none (or for a unary body)."""
        usage = response.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        message = _error_text(response)
        if message is not None:
            self._set_error(message)
        seen = self.choices.choices.get(0)
        carried = False
        if not (stream and seen is not None and seen.content_chunks):
            carried = self._output(response.get("output"))
        status = response.get("status")
        reason: str | None = None
        if status == "completed":
            reason = "tool_calls" if self.calls else "stop"
        elif status == "incomplete":
            details = response.get("incomplete_details")
            why = details.get("reason") if isinstance(details, dict) else None
            reason = INCOMPLETE_REASONS.get(why, why) if isinstance(why, str) else "incomplete"
        elif status == "cancelled":
            reason = "cancelled"
        choice = self._choice() if reason is not None else None
        if choice is not None and reason is not None:
            choice.finish_reason = reason[:MAX_ID_CHARS]
        return carried

    def _output(self, items: Any) -> bool:
        """Text of every output item, in order; one content chunk in all."""
        if not isinstance(items, list):
            return False
        pieces: list[Any] = []
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                self.calls = True
                pieces += [item.get("name"), item.get("arguments")]
            for key in ("summary", "content"):
                parts = item.get(key)
                if isinstance(parts, list):
                    for part in parts:
                        if isinstance(part, dict):
                            pieces += [part.get("text"), part.get("refusal")]
        texts = [piece for piece in pieces if isinstance(piece, str) and piece]
        choice = self._choice() if texts else None
        if choice is None:
            return False
        for text in texts:
            self.choices.add_text(choice, text)
        choice.content_chunks += 1
        return True


def _error_text(obj: dict[str, Any]) -> str | None:
    """``error.message`` of a response (or the message of an error event)."""
    error = obj.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return clip(message)
        return clip(json.dumps(error, ensure_ascii=False))
    if isinstance(error, str) and error:
        return clip(error)
    if obj.get("type") == "error" and isinstance(obj.get("message"), str):
        return clip(obj["message"])
    return None
