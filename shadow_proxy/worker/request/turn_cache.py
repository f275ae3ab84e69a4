"""The previous turn's prompt of each conversation: where its next turn's answer sits,
without rendering the conversation again.

Pure module; one ``TurnCache`` per model in each shard. Only requests that name
their session are kept and looked up (``prompt.chat_tokens``): the main routes
a session's turns to one shard, and a request without one costs nothing here.

``answer_spans`` (``spans.py``) places a conversation's newest answer ``j`` with
two renders: ``messages[:j]`` (the head) and ``messages[:j+1]`` with a probe for
the answer's content (its frame). When the turn before came to this shard, the
head is that turn's prompt without its generation prompt: the very messages
``messages[:j]`` under the same template and request context, rendered with
``add_generation_prompt`` (the cache keeps that text, less the generation
prompt). The generation prompt and an answer's frame are the template's, learned
once per request context (``frames``: three renders of a one-turn probe). What
the two say is then checked where the renders' would be (``spans.place_answer``):
head, frame and content must be the prompt's own text, cut where the tokenizer
cuts, and encode to the prompt's ids; anything else (a template whose frames
depend on the turn, a context the probe cannot render, an answer with tool calls,
a first turn seen elsewhere) leaves it to the renders.

Bound: at most ``max_bytes`` (``worker.turn_cache_bytes`` per shard, split
across models) of prompts, least recently used out. A prompt is counted twice
its size (``sys.getsizeof``): its text, and the request's own parsed messages
it holds to compare the next turn's with; and its ids at ``ID_BYTES`` each with
their MessagePack. One prompt at most a quarter of the bound.
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from shadow_proxy.worker.request.spans import PROBE

#: Default bound of one model's turn cache (``TurnCache.cost`` counts it).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: What one prompt id held costs: its list slot, and the int (those under 256 are
#: shared, the rest are not).
ID_BYTES = 36
#: Request contexts whose frames are kept.
MAX_CONTEXTS = 64
#: Request fields no chat template reads (sampling and output options): turns that
#: differ only in them render alike.
_NOT_RENDERED = frozenset(
    {
        "messages",
        "model",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "user",
        "ignore_eos",
        "min_tokens",
        "nvext",
    }
)
_QUESTION = "shadow-question"


@attrs.frozen
class Frames:
    """What a template adds around a turn in one request context."""

    #: What ``add_generation_prompt`` appends to a prompt.
    generation: str
    #: An assistant message's frame: ``before`` + content + ``after``.
    before: str
    after: str


@attrs.define
class _Turn:
    messages: list[Any]
    #: The turn's prompt; its head (less the generation prompt) is ``text[:cut]``.
    text: str
    cut: int
    #: Where the prompt's scan restarted, and its ids (``IncrementalEncoder.Resume``).
    resume: Any


def context_key(request: dict) -> Hashable:
    """What a request gives its chat template besides its messages (anything not
    known to be a sampling or output option), as a comparable value."""
    rest = {k: v for k, v in request.items() if k not in _NOT_RENDERED}
    if not rest:
        return ""
    return json.dumps(rest, sort_keys=True, default=repr)


@attrs.define
class TurnCache:
    """Each conversation's previous prompt, less its generation prompt; bounded."""

    max_bytes: int = DEFAULT_MAX_BYTES
    size_bytes: int = attrs.field(default=0, init=False)
    hits: int = attrs.field(default=0, init=False)
    _turns: collections.OrderedDict[Hashable, _Turn] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _frames: collections.OrderedDict[Hashable, Frames | None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )

    @staticmethod
    def cost(text: str, resume: Any) -> int:
        """The prompt twice (its text, and the parsed messages held beside it),
        and its ids: a list slot and an int each (``ID_BYTES``), and their
        MessagePack."""
        return 2 * sys.getsizeof(text) + ID_BYTES * len(resume.ids) + len(resume.ids.items)

    def frames(self, render: Callable[[dict], str], request: dict) -> Frames | None:
        """The generation prompt and an answer's frame in ``request``'s context,
        rendered once per context; None when the template does not render a
        one-turn probe or not as a prefix-stable sequence."""
        key = context_key(request)
        if key in self._frames:
            self._frames.move_to_end(key)
            return self._frames[key]
        frames = None
        question = {"role": "user", "content": _QUESTION}
        answer = {"role": "assistant", "content": PROBE}
        try:
            asked = render({**request, "messages": [question], "add_generation_prompt": False})
            generating = render({**request, "messages": [question], "add_generation_prompt": True})
            answered = render(
                {**request, "messages": [question, answer], "add_generation_prompt": False}
            )
        except Exception:  # a template that refuses the probe: the renders decide
            asked = generating = answered = ""
        if (
            asked
            and generating.startswith(asked)
            and answered.startswith(asked)
            and answered.count(PROBE) == 1
        ):
            before, after = answered[len(asked) :].split(PROBE)
            frames = Frames(generating[len(asked) :], before, after)
        self._frames[key] = frames
        while len(self._frames) > MAX_CONTEXTS:
            self._frames.popitem(last=False)
        return frames

    def head(
        self, request: dict, messages: list[Any], j: int, text: str, frames: Frames
    ) -> tuple[int, Any]:
        """How much of ``text`` (the prompt of ``messages``) is the prompt of the turn
        whose messages were ``messages[:j]`` (in the same context) less its
        generation prompt, and where that prompt's scan restarted (its
        ``Resume``); (0, None) when this cache has not seen that turn or
        ``text`` does not begin with it. Compared in place when the answer's
        frame opens as the generation prompt does (the usual case: both begin
        an assistant turn), else on a copy of the head."""
        key = (context_key(request), j, _last_content(messages, j))
        turn = self._turns.get(key)
        if turn is None or turn.messages != messages[:j]:
            return 0, None
        self._turns.move_to_end(key)
        previous, cut = turn.text, turn.cut
        if frames.before.startswith(frames.generation):
            found = text.startswith(previous)  # head + generation, and head + before + ...
        else:
            found = text.startswith(previous[:cut])
        if not found:
            return 0, None
        self.hits += 1
        return cut, turn.resume

    def remember(
        self, request: dict, messages: list[Any], text: str, frames: Frames, resume: Any
    ) -> None:
        """Keep ``text``, the prompt of ``messages``, and where its scan restarted
        (``resume``), for the conversation's next turn."""
        if (
            request.get("add_generation_prompt") is False
            or request.get("continue_final_message") is True
            or not text.endswith(frames.generation)
        ):
            return
        cost = self.cost(text, resume)
        if cost > self.max_bytes // 4:
            return
        key = (context_key(request), len(messages), _last_content(messages, len(messages)))
        old = self._turns.pop(key, None)
        if old is not None:
            self.size_bytes -= self.cost(old.text, old.resume)
        while self._turns and self.size_bytes + cost > self.max_bytes:
            _, evicted = self._turns.popitem(last=False)
            self.size_bytes -= self.cost(evicted.text, evicted.resume)
        cut = len(text) - len(frames.generation)
        self._turns[key] = _Turn(list(messages), text, cut, resume)
        self.size_bytes += cost


def _last_content(messages: list[Any], j: int) -> Any:
    """What tells conversations apart cheaply: the content of ``messages[j-1]``
    (its hash is the string's own; anything else, its type)."""
    if not j:
        return None
    last = messages[j - 1]
    content = last.get("content") if isinstance(last, dict) else None
    return content if isinstance(content, str) else type(content).__name__
