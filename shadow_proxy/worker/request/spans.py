"""Where the newest assistant answer sits in a chat prompt's token ids (``prompt_spans``).

Pure module; runs in the tap worker after a chat prompt is rendered and encoded.
``answer_spans`` says, for the last assistant message of the conversation (the
answer to the conversation's previous turn), which token positions
``[start, end)`` of the prompt hold it and the template's text around its
content (the *frame*: ``before`` + content + ``after`` is the text the template
rendered for that message), and how many assistant messages there are.
``shadow-replay --closed-loop`` swaps each answer for the candidate's own: it
replaces ``[start, end)`` with the encoding of ``before + candidate text +
after``, which is what the frontend would have encoded had the client sent the
candidate's answer back. Earlier answers sit where the earlier turns' records
placed them (turn k+1's prompt begins with turn k's).

How: ``messages[:j]`` is rendered before the last assistant message ``j``, and
``messages[:j+1]`` with its content replaced by ``PROBE``, which shows the
frame; head + before + content + after must then be a prefix of the prompt
text. Both character offsets must be *safe* cuts, beside an added (special)
token, which the tokenizer splits off before anything else, so the pieces
encode alone as they do together; the message and what follows it are encoded
and must equal the prompt's last ids. Anything else (a template that renders
earlier turns differently once a later one follows, a content the template
rewrites, a cut inside a token) leaves the request without spans: ``None``, and
the replay falls back to open-loop for that conversation (``no_spans``).

Cost: two renders of a prefix and the encoding of the prompt's end (from the
last assistant message on); requests without an assistant message cost
nothing. When the conversation's previous turn came to the same shard, its
prompt is the head and the template's learned frame the frame
(``turn_cache.py``): no render at all, the same checks (``place_answer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: Stands for an answer's content in a render that finds its frame (private-use
#: characters: no template rewrites them, no client sends them by chance).
PROBE = "\ue000shadow-answer\ue001"


def answer_spans(
    messages: Sequence[Any],
    text: str,
    token_ids: Sequence[int],
    render_prefix: Callable[[int, str | None], str],
    encode: Callable[[str], list[int]],
    added: Iterable[str],
) -> dict[str, Any] | None:
    """``{"assistants": N, "answers": [{message, start, end, before, after} or
    {message, start, end, tool_calls: true}]}`` for the last assistant message
    of ``messages`` in the prompt ``text`` (encoded as ``token_ids``), or None
    when it cannot be placed exactly. ``N`` counts the assistant messages.

    ``render_prefix(k, content)`` renders ``messages[:k]`` without the
    generation prompt (the last one's content replaced by ``content`` unless
    None); ``encode`` encodes a text as the prompt is encoded; ``added`` are the
    tokenizer's added tokens (their text)."""
    j = last_answer(messages)
    if j is None or answer_content(messages[j]) is None:
        return None
    try:
        head = render_prefix(j, None) if j else ""
        probe = render_prefix(j + 1, PROBE)
    except Exception:  # a template that refuses a prefix (e.g. must end with a user turn)
        return None
    if not probe.startswith(head) or probe.count(PROBE) != 1:
        return None
    before, after = probe[len(head) :].split(PROBE)
    if not text.startswith(head):
        return None  # earlier turns render otherwise later on
    return place_answer(messages, j, text, token_ids, len(head), before, after, encode, added)


def last_answer(messages: Sequence[Any]) -> int | None:
    """The index of the last assistant message, if any."""
    for j in range(len(messages) - 1, -1, -1):
        message = messages[j]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return j
    return None


def answer_content(message: dict) -> str | None:
    """An answer's text content (None as ""); None for content parts, whose
    frame is not known."""
    content = message.get("content")
    if content is None:
        return ""
    return content if isinstance(content, str) else None


def place_answer(
    messages: Sequence[Any],
    j: int,
    text: str,
    token_ids: Sequence[int],
    head: int,
    before: str,
    after: str,
    encode: Callable[[str], list[int]],
    added: Iterable[str],
) -> dict[str, Any] | None:
    """``answer_spans`` of answer ``j`` given where its frame begins in ``text``
    (``head``: the caller has checked what comes before) and the frame: frame
    and content must follow there, the text cut at both ends beside an added
    token, and their encodings the prompt's ids."""
    message = messages[j]
    content = answer_content(message)
    if content is None:
        return None
    at = head  # before + content + after follow (compared in place: no copy)
    for piece in (before, content, after):
        if not text.startswith(piece, at):
            return None  # the content is rewritten, or the frame is another
        at += len(piece)
    specials = tuple(added)
    if not (_safe(text, head, specials) and _safe(text, at, specials)):
        return None
    segment, rest = (
        encode(text[head:at]),
        encode(text[at:]) if text[at:] else [],
    )
    end = len(token_ids) - len(rest)
    start = end - len(segment)
    if start < 0 or list(token_ids[end:]) != rest or list(token_ids[start:end]) != segment:
        return None
    answer: dict[str, Any] = {"message": j, "start": start, "end": end}
    if message.get("tool_calls"):
        answer["tool_calls"] = True  # no frame: a new answer would change the calls
    else:
        answer.update(before=before, after=after)
    assistants = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    return {"assistants": assistants, "answers": [answer]}


def _safe(text: str, at: int, specials: tuple[str, ...]) -> bool:
    """Whether the encoding may be cut at character ``at``: an end of the text,
    or beside an added token (split off before anything else is encoded)."""
    if at in (0, len(text)):
        return True
    return text.startswith(specials, at) or text[:at].endswith(specials)
