"""The work budget of one request in the tap worker.

Pure. Every bound here is checked before the work it bounds, or between
steps of it, so one request (hostile or just huge) cannot take a shard's
memory or its CPU without limit:

- **prompt bytes** (``worker.max_prompt_bytes``; by default, per model, the
  context length times ``MAX_BYTES_PER_TOKEN``, or the longest token's UTF-8
  bytes if fewer): the message and tool sizes are estimated before the template
  is rendered (tools are measured with ``json.dumps`` until the bound is
  passed), and the rendered text is measured before it is encoded. Past the
  bound the request is not mirrored (``prompt_over_budget``). Encoding costs
  CPU by the byte (DeepSeek's pre-tokenizer: about 0.8 s per MiB here, 5.4 s
  for a 7 MiB prompt that could never fit 32k tokens), so this is also the
  bound on tokens encoded: about the context length. Text averages 1.4 to 6
  bytes per token (prose, code, CJK, base64); only long runs of spaces or
  repeated punctuation go past 32 (DeepSeek: 64 to 127), so a prompt the
  frontend would take is refused only if it is mostly such runs, or if the
  template renders less than the messages' text (one that ignores tools, say):
  counted, never silent; set ``worker.max_prompt_bytes`` to take it;
- **decoded bytes** (``worker.max_decoded_bytes``): a content-encoded response
  body is decoded up to this many bytes; past it the record carries what was
  read, with the reason (``ResponseRecorder.give_up``);
- **events** (no setting: derived per request): a streamed response is read for
  at most ``EVENTS_PER_TOKEN`` events per token the request lets the engine
  generate (``n`` x ``max_tokens``, or x the context length when unset) plus
  ``EVENT_SLACK``; a frontend that sends more (a gzip bomb of chunks, a loop)
  has its record carry what was read, with the reason (``response_events``);
- **CPU time** (``worker.max_request_cpu_s``): a shard charges each request the
  thread CPU time of the messages it handled for it, and checks it between
  decoded pieces of a response (at most ``decoding.DECODE_STEP`` bytes, tens
  of milliseconds of parsing) as well as between messages; past the bound, its
  response is not read further and the record carries what was read.

A response read no further past any of these is not encoded at its end either
(its kept text, up to the recorder's caps, could cost seconds): its record counts
content chunks and carries no output token ids.

The shard restarts itself between requests past ``worker.max_rss_mb``
(``worker/main/pool.py``), every in-flight record accounted for.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from typing import Any

import attrs

MIB = 1024 * 1024
#: The most bytes per token a prompt is expected to average (module docstring).
MAX_BYTES_PER_TOKEN = 32
#: When the model's context length is unknown: 128k tokens.
DEFAULT_PROMPT_BYTES = 131072 * MAX_BYTES_PER_TOKEN
#: SSE events a streamed response may carry per token it may generate. Frontends
#: send a token per event or fewer (Dynamo, vLLM, SGLang); reasoning and tool-call
#: deltas are tokens too; the slack covers role, finish, usage and the Responses
#: API's lifecycle events. Four times over, so that only a broken frontend meets it.
EVENTS_PER_TOKEN = 4
EVENT_SLACK = 256


class WorkBudget(enum.StrEnum):
    """Which budget a response was read no further past
    (``shadow_worker_budget_exceeded_total{budget}``)."""

    #: ``worker.max_decoded_bytes``.
    DECODED = "decoded"
    #: More events than ``n`` x ``max_tokens`` accounts for.
    EVENTS = "events"
    #: ``worker.max_request_cpu_s``.
    CPU = "cpu"


def response_events(n: int, max_tokens: int | None, context_length: int | None) -> int | None:
    """The most SSE events a response to the request is read for (None: no bound,
    when neither ``max_tokens`` nor the context length is known)."""
    tokens = max_tokens if max_tokens is not None else context_length
    if tokens is None:
        return None
    return max(1, n) * tokens * EVENTS_PER_TOKEN + EVENT_SLACK


@attrs.frozen
class Budget:
    #: None: derived per model (``prompt_bytes``).
    max_prompt_bytes: int | None = None
    max_decoded_bytes: int = 64 * MIB
    max_request_cpu_s: float = 5.0

    def prompt_bytes(self, context_length: int | None, longest_token_bytes: int) -> int:
        if self.max_prompt_bytes is not None:
            return self.max_prompt_bytes
        if context_length is None:
            return DEFAULT_PROMPT_BYTES
        return context_length * max(1, min(longest_token_bytes, MAX_BYTES_PER_TOKEN))


def longest_token_bytes(backend: Any) -> int:
    """UTF-8 bytes of the longest token of a ``tokenizers.Tokenizer`` vocabulary, added
    tokens included: no token stands for more text than this (byte-level and
    Metaspace tokens stand for fewer bytes than their spelling)."""
    vocab = backend.get_vocab(with_added_tokens=True)
    return max((len(token.encode("utf-8")) for token in vocab), default=1)


def chat_text_over(messages: Iterable[Any], tools: Any, limit: int) -> bool:
    """Whether the messages' text and the tools' JSON certainly exceed ``limit``
    characters (stops measuring as soon as they do)."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    total += len(text)
        if total > limit:
            return True
    if isinstance(tools, list):
        for tool in tools:
            try:
                total += len(json.dumps(tool, ensure_ascii=False))
            except (TypeError, ValueError, RecursionError):
                return False  # the template will fail on it the same way
            if total > limit:
                return True
    return False


def text_over(text: str, limit: int) -> bool:
    """Whether ``text`` is longer than ``limit`` bytes in UTF-8."""
    if len(text) > limit:
        return True
    return len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit
