"""Where the assistant answers sit in a chat prompt's token ids (``prompt_spans``).

Pure module; runs in the tap worker after a chat prompt is rendered and encoded.
``answer_spans`` says, for each assistant message of the conversation, which
token positions ``[start, end)`` of the prompt hold it and the template's text
around its content (the *frame*: ``before`` + content + ``after`` is the text
the template rendered for that message). ``shadow-replay --closed-loop`` swaps a
turn's recorded answer for the candidate's own: it replaces ``[start, end)``
with the encoding of ``before + candidate text + after``, which is what the
frontend would have encoded had the client sent the candidate's answer back.

How: the conversation's prefixes are rendered without the generation prompt:
``messages[:j]`` before assistant message ``j``, and ``messages[:j+1]`` with
its content replaced by ``PROBE``, which shows the frame; head + before +
content + after must then be a prefix of the prompt text.
Character offsets become token positions where the prompt's encoding cuts
there, and only at *safe* cuts: next to an added (special) token, which the
tokenizer splits off before anything else, so the pieces encode alone as they
do together. Anything else (a template that renders earlier turns differently
once a later one follows, a content the template rewrites, a cut inside a
token) leaves the request without spans: ``None``, and the replay falls back to
open-loop for that conversation and counts it (``no_spans``).

Cost: two renders per assistant message (at most ``MAX_ANSWERS`` of them) and
one encoding with offsets; requests without an assistant message cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: Conversations with more assistant messages than this get no spans (each costs
#: two renders of its prefix).
MAX_ANSWERS = 64
#: Stands for an answer's content in a render that finds its frame (private-use
#: characters: no template rewrites them, no client sends them by chance).
PROBE = "\ue000shadow-answer\ue001"


def answer_spans(
    messages: Sequence[Any],
    text: str,
    token_ids: Sequence[int],
    render_prefix: Callable[[int, str | None], str],
    encode_offsets: Callable[[str], tuple[list[int], list[tuple[int, int]], list[bool]]],
) -> dict[str, Any] | None:
    """``{"answers": [{message, start, end, before, after, tool_calls?}, ...]}``
    for the assistant messages of ``messages`` in the prompt ``text`` (encoded
    as ``token_ids``), or None when they cannot be placed exactly.

    ``render_prefix(k, content)`` renders ``messages[:k]`` without the
    generation prompt (the last one's content replaced by ``content`` unless None);
    ``encode_offsets(text)`` returns the ids, their character offsets and
    whether each is an added token."""
    assistants = [
        j for j, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    if not assistants or len(assistants) > MAX_ANSWERS:
        return None
    ids, offsets, added = encode_offsets(text)
    if list(ids) != list(token_ids):
        return None  # the prompt was not encoded from this text alone (token_data, NULs)
    cuts = _safe_cuts(offsets, added, len(text))
    answers = []
    for j in assistants:
        message = messages[j]
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            return None  # content parts: the frame of a text answer is not known
        try:
            head = render_prefix(j, None) if j else ""
            probe = render_prefix(j + 1, PROBE)
        except Exception:  # a template that refuses a prefix (e.g. must end with a user turn)
            return None
        if not probe.startswith(head) or probe.count(PROBE) != 1:
            return None
        before, after = probe[len(head) :].split(PROBE)
        tail = head + before + content + after
        if not text.startswith(tail):
            return None  # earlier turns render otherwise later on, or the content is rewritten
        start, end = cuts.get(len(head)), cuts.get(len(tail))
        if start is None or end is None or end <= start:
            return None
        answer: dict[str, Any] = {"message": j, "start": start, "end": end}
        if message.get("tool_calls"):
            answer["tool_calls"] = True  # no frame: a new answer would change the calls
        else:
            answer.update(before=before, after=after)
        answers.append(answer)
    return {"answers": answers}


def _safe_cuts(offsets: Sequence[tuple[int, int]], added: Sequence[bool], length: int) -> dict:
    """Character offset -> token position, for the offsets where the encoding may
    be cut: the text's two ends, and token boundaries beside an added token."""
    cuts = {0: 0, length: len(offsets)}
    for t in range(1, len(offsets)):
        if not (added[t] or added[t - 1]):
            continue
        if offsets[t - 1][1] <= offsets[t][0]:
            cuts[offsets[t][0]] = t
    return cuts
