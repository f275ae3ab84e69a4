"""A multi-turn load: conversations whose turns grow on their own history.

Used by the demo's multi-turn run (and open to the benchmarks). Chat and agent
traffic look like this: every request of a conversation resends the whole
history, so each turn's prompt is the previous turn's prompt, the assistant's
answer to it and a new user message; many conversations run at once, each one
turn at a time. That is the traffic a KV prefix cache is for.

``run_conversations`` runs once per load. Each of ``conversations``
conversations sends ``turns`` streaming chat requests one after the other
(turn ``t + 1`` is built when turn ``t``'s answer has arrived); the
conversations run concurrently. The messages of a conversation are: a system
message shared by every conversation (an agent's instructions), then the first
user message, then for each later turn the assistant's answer as the frontend
streamed it and a new user message. Each request carries
``x-request-id: {session}-turn-{t}`` and the session header
``x-dynamo-session-id: {session}`` (``session`` = ``conv-NN``), the header
Dynamo reads into the engine's ``agent_context``.

Guarantees: every request of every conversation gets exactly one
``loadgen.Result`` (a turn that cannot be sent because an earlier turn failed
is recorded as an error, ``"earlier turn failed"``), indexed
``conversation * turns + turn``; prompts are distinct per conversation and the
same for the same seed; the bodies sent are kept (``ConversationReport.bodies``)
so that a prompt can be sent again.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp
import attrs

from shadow_proxy.devtools.loadgen import LoadSpec, Report, Result, make_prompt, usage_of

PATH = "/v1/chat/completions"
SESSION_HEADER = "x-dynamo-session-id"
REQUEST_ID_HEADER = "x-request-id"


@attrs.frozen
class ConversationSpec:
    """What to send: how many conversations, how many turns, how long each part is."""

    url: str
    model: str
    conversations: int = 20
    turns: int = 8
    #: Tokens of the system message every conversation starts with.
    system_tokens: int = 256
    #: Tokens of a conversation's first user message.
    first_tokens: int = 256
    #: Tokens of each later user message.
    turn_tokens: int = 64
    output_tokens: int = 32
    seed: int = 0
    tokens_per_word: float = 1.0
    timeout_s: float = 600.0

    @property
    def requests(self) -> int:
        return self.conversations * self.turns

    def session(self, conversation: int) -> str:
        """The session id of ``conversation``."""
        return f"conv-{conversation:02d}"

    def request_id(self, conversation: int, turn: int) -> str:
        """The request id of ``turn`` (from 0) of ``conversation``."""
        return f"{self.session(conversation)}-turn-{turn}"

    def index(self, conversation: int, turn: int) -> int:
        """The request's index in the report."""
        return conversation * self.turns + turn

    def load_spec(self) -> LoadSpec:
        """The nearest single-turn ``LoadSpec`` (for ``Report``; the shape is this one's)."""
        return LoadSpec(
            url=self.url,
            model=self.model,
            requests=self.requests,
            concurrency=self.conversations,
            prompt_tokens=self.system_tokens + self.first_tokens,
            output_tokens=self.output_tokens,
            stream=True,
            seed=self.seed,
            tokens_per_word=self.tokens_per_word,
        )


@attrs.define
class ConversationReport(Report):
    """A ``loadgen.Report`` (one ``Result`` per turn) plus the bodies sent, by index."""

    bodies: dict[int, dict[str, Any]] = attrs.field(factory=dict)

    def probe(self, index: int) -> tuple[str, bytes] | None:
        """Request ``index``'s prompt again, unary, for one token (None if it was
        never sent)."""
        body = self.bodies.get(index)
        if body is None:
            return None
        again = {k: v for k, v in body.items() if k != "stream_options"}
        again.update(stream=False, max_tokens=1)
        return PATH, json.dumps(again).encode()


def system_message(spec: ConversationSpec) -> str:
    """The system message every conversation shares."""
    rng = random.Random(spec.seed * 1_000_003 - 1)
    return "You are the demo's agent. " + make_prompt(rng, spec.system_tokens, spec.tokens_per_word)


def user_message(spec: ConversationSpec, conversation: int, turn: int) -> str:
    """The user message of ``turn`` of ``conversation`` (the first one longer)."""
    rng = random.Random((spec.seed * 1_000_003 + conversation) * 1_009 + turn)
    tokens = spec.first_tokens if turn == 0 else spec.turn_tokens
    head = f"Conversation {conversation}, turn {turn}. "
    return head + make_prompt(rng, tokens, spec.tokens_per_word)


def answer_text(sse: bytes) -> str:
    """The assistant's text of a streamed chat answer (choice 0's content deltas)."""
    parts = []
    for line in sse.split(b"\n"):
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        for choice in event.get("choices") or []:
            if choice.get("index", 0) == 0:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    parts.append(content)
    return "".join(parts)


async def _turn(
    session: aiohttp.ClientSession,
    spec: ConversationSpec,
    conversation: int,
    turn: int,
    body: dict[str, Any],
) -> tuple[Result, str | None]:
    """Send one turn; its result and the answer's text (None unless it completed)."""
    result = Result(spec.index(conversation, turn), request_id=spec.request_id(conversation, turn))
    headers = {
        "Content-Type": "application/json",
        REQUEST_ID_HEADER: result.request_id,
        SESSION_HEADER: spec.session(conversation),
    }
    started = time.perf_counter()
    answer = None
    try:
        async with session.post(spec.url + PATH, json=body, headers=headers) as response:
            result.status = response.status
            chunks = []
            async for chunk in response.content.iter_any():
                if result.ttft_s is None:
                    result.ttft_s = time.perf_counter() - started
                chunks.append(chunk)
            data = b"".join(chunks)
        if response.status == 200:
            if not data.rstrip().endswith(b"data: [DONE]"):
                result.error = "stream ended without [DONE]"
            else:
                answer = answer_text(data)
                result.usage = _last_usage(data)
        else:
            result.error = f"status {response.status}"
    except (aiohttp.ClientError, ValueError, TimeoutError) as e:
        result.error = type(e).__name__
    result.e2e_s = time.perf_counter() - started
    return result, answer


def _last_usage(sse: bytes) -> dict[str, Any] | None:
    for line in reversed(sse.split(b"\n")):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                usage = usage_of(json.loads(line[5:]))
            except ValueError:
                continue
            if usage:
                return usage
    return None


async def run_conversations(spec: ConversationSpec) -> ConversationReport:
    """Send every conversation, turn after turn, all conversations at once."""
    system = system_message(spec)
    report = ConversationReport(spec.load_spec(), [], 0.0)
    connector = aiohttp.TCPConnector(limit=spec.conversations)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)

    async def converse(session: aiohttp.ClientSession, conversation: int) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        failed = False
        for turn in range(spec.turns):
            index = spec.index(conversation, turn)
            if failed:
                result = Result(index, spec.request_id(conversation, turn))
                result.error = "earlier turn failed"
                report.results.append(result)
                continue
            messages.append({"role": "user", "content": user_message(spec, conversation, turn)})
            body = {
                "model": spec.model,
                "messages": list(messages),
                "max_tokens": spec.output_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }
            report.bodies[index] = body
            result, answer = await _turn(session, spec, conversation, turn, body)
            report.results.append(result)
            if answer is None or not result.ok:
                failed = True
            else:
                messages.append({"role": "assistant", "content": answer})

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(converse(session, c) for c in range(spec.conversations)))
        report.duration_s = time.perf_counter() - started
    report.results.sort(key=lambda r: r.index)
    return report
