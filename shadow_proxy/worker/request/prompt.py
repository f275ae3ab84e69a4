"""The prompt's token ids, as a Dynamo frontend builds them.

Chat: the model's chat template renders the messages (normalised as Dynamo
hands them to templates), tools and ``chat_template_kwargs`` with the
generation prompt, then the text is encoded without special tokens.
Completions: a string prompt is encoded as it is, a token-id prompt used as it
is. NUL characters are stripped before encoding, as Dynamo does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from shadow_proxy.worker.budget import chat_text_over, text_over
from shadow_proxy.worker.request.fields import (
    U32,
    Reject,
    is_int,
)
from shadow_proxy.worker.request.spans import answer_spans, last_answer, place_answer
from shadow_proxy.worker.request.tokenizer import LoadedModel

#: Key of ``multi_modal_data`` that holds completions' ``prompt_embeds`` (base64).
#: Dynamo keeps them in a top-level ``prompt_embeds`` field that
#: ``PreprocessedRequest`` lacks; here they count as multimodal data, so that
#: ``skip-multimodal`` skips them, and ``strip-embeds`` removes this key.
PROMPT_EMBEDS_KEY = "prompt_embeds"

_MEDIA_PARTS = ("image_url", "video_url", "audio_url")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def chat_tokens(
    model: LoadedModel,
    request: dict,
    nvext: dict,
    multi_modal_data: dict,
    conversation: bool = False,
) -> tuple[list[int], dict[str, Any] | None]:
    """The prompt's ids, and where its assistant answers sit (``spans.answer_spans``;
    None when there are none or they cannot be placed exactly). ``conversation``:
    the request names its session (its next turn comes to this shard): the
    model's turn cache keeps its prompt for that turn and looks up the turn
    before."""
    messages = request.get("messages")
    if messages is None or messages == []:
        raise Reject("missing_messages")
    if not isinstance(messages, list):
        raise Reject("invalid_field")
    vllm = model.template_engine == "jinja2"
    for message in messages:
        if not vllm:  # vLLM's checks are its normalisation's (templates/vllm_messages.py)
            _check_message(message)
        elif not isinstance(message, dict):
            raise Reject("invalid_field")
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            _gather_media(message["content"], multi_modal_data)
    tools = request.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)
    ):
        raise Reject("invalid_field")
    token_data = token_list(nvext.get("token_data")) if "token_data" in nvext else None
    if token_data is not None:  # pre-tokenized by an external router: Dynamo skips encoding
        return token_data, None
    if model.chat_template is None:
        raise Reject("template_error")
    limit = model.max_prompt_bytes
    if limit is not None:
        # Dynamo's default leaves tools out with tool_choice none
        # (--exclude-tools-when-tool-choice-none), so they do not count then;
        # vLLM's keeps them.
        counted = None if request.get("tool_choice") == "none" and not vllm else tools
        if chat_text_over(messages, counted, limit):
            raise Reject("prompt_over_budget")  # not rendered, not encoded
    try:
        text = model.chat_template.render(request)
    except Reject:
        raise
    except Exception:  # the template failed (raise_exception included): the frontend's 400
        raise Reject("template_error") from None
    turns = model.turns
    if not conversation or turns is None or model.prompt_encoder is None or "\0" in text:
        ids = encode(model, text, keep_nul=vllm)
        return ids, _spans(model, request, messages, text, ids)
    # The conversation's previous turn, when it came to this shard: its prompt
    # begins this one (the scan of the text resumes near its end), and places
    # the newest answer without a render.
    frames = turns.frames(model.chat_template.render, request)
    head, resume = 0, None
    j = last_answer(messages)
    if frames is not None and j is not None and not messages[j].get("tool_calls"):
        head, resume = turns.head(request, messages, j, text, frames)
    ids, resumed = encode_turn(model, text, resume, head)
    spans = None
    if head and frames is not None and j is not None:
        spans = _placed(model, messages, j, text, ids, head, frames)
    if spans is None:
        spans = _spans(model, request, messages, text, ids)
    if frames is not None and resumed is not None:
        turns.remember(request, messages, text, frames, resumed)
    return ids, spans


def _placed(
    model: LoadedModel, messages: list, j: int, text: str, ids: list[int], head: int, frames: Any
) -> dict[str, Any] | None:
    """Answer ``j``'s spans given where its frame begins (``head``: the previous
    turn's prompt, less its generation prompt, begins ``text``) and the
    template's learned frame, checked as ``answer_spans`` checks the renders'."""
    encode_text, added = _encoder(model), _added_tokens(model.backend)
    try:
        return place_answer(
            messages, j, text, ids, head, frames.before, frames.after, encode_text, added
        )
    except Exception:  # spans are a help for replay; the renders may still place it
        return None


def _encoder(model: LoadedModel) -> Callable[[str], list[int]]:
    """How the spans encode parts of the prompt: as the prompt was encoded."""
    vllm = model.template_engine == "jinja2"
    encoder = model.prompt_encoder

    def encode_text(piece: str) -> list[int]:
        piece = piece if vllm or "\0" not in piece else piece.replace("\0", "")
        # Parts of the prompt just encoded: the incremental encoder finds their
        # segments in its cache (its ids are a full encode's, so the same spans).
        if encoder is not None:
            return encoder.encode(piece, counted=False)
        return model.encode(piece)

    return encode_text


def _spans(
    model: LoadedModel, request: dict, messages: list, text: str, ids: list[int]
) -> dict[str, Any] | None:
    """``answer_spans`` with the held-out renders, else the full renders."""
    template = model.chat_template
    if template is None or model.backend is None:
        return None

    def render_prefix(k: int, content: str | None) -> str:
        prefix = messages[:k]
        if content is not None:
            prefix = [*prefix[:-1], {**prefix[-1], "content": content}]
        return template.render({**request, "messages": prefix, "add_generation_prompt": False})

    encode_text, added = _encoder(model), _added_tokens(model.backend)
    try:
        light = _held_renders(template, request, messages, text)
        if light is not None:
            spans = answer_spans(messages, text, ids, light, encode_text, added)
            if spans is not None:
                return spans
        return answer_spans(messages, text, ids, render_prefix, encode_text, added)
    except Exception:  # spans are a help for replay; the record goes out without them
        return None


#: Stands for the k-th long content in a render with the contents held out
#: (private-use characters, as ``spans.PROBE``).
_HOLE = re.compile("\ue002([0-9]+)\ue003")
#: Contents at least this long are held out of the prefix renders.
_HELD_CHARS = 64


def _held_renders(
    template: Any, request: dict, messages: list, text: str
) -> Callable[[int, str | None], str] | None:
    """``render_prefix`` for ``answer_spans`` at a fraction of the cost: each long
    string content is held out (a short placeholder in its place, put back in
    the text the template rendered), so that a render of a prefix costs what
    the template's frames cost rather than the conversation's length. None when
    no content is long, or the prompt holds the placeholders' characters.

    Whether the template prints each content as it is, ``answer_spans`` checks
    on what these renders give: the head and the answer's frame, put back, must
    be the prompt's own text up to the answer's end, cut where the tokenizer
    cuts, and encode to the prompt's ids; a template that cuts, rewrites or
    decides on a content fails that, and the caller then renders in full."""
    if "\ue002" in text or "\ue003" in text:
        return None  # the prompt holds the placeholders' characters itself
    held: list[Any] = []
    contents: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and len(content) >= _HELD_CHARS:
            message = {**message, "content": f"\ue002{len(contents)}\ue003"}
            contents.append(content)
        held.append(message)
    if not contents:
        return None

    def put_back(rendered: str) -> str:
        parts = _HOLE.split(rendered)
        for at in range(1, len(parts), 2):
            index = int(parts[at])
            if index >= len(contents):
                raise ValueError("a placeholder the template made up")
            parts[at] = contents[index]
        return "".join(parts)

    def render_prefix(k: int, content: str | None) -> str:
        prefix = held[:k]
        if content is not None:
            prefix = [*prefix[:-1], {**prefix[-1], "content": content}]
        rendered = template.render({**request, "messages": prefix, "add_generation_prompt": False})
        return put_back(rendered)

    return render_prefix


@functools.lru_cache(maxsize=16)
def _added_tokens(backend: Any) -> tuple[str, ...]:
    """The text of the tokenizer's added tokens, once per tokenizer."""
    return tuple(token.content for token in backend.get_added_tokens_decoder().values())


def _check_message(message: Any) -> None:
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise Reject("invalid_field")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise Reject("invalid_field")
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise Reject("invalid_field")
        kind = part["type"]
        if kind == "text" and not isinstance(part.get("text"), str):
            raise Reject("invalid_field")
        if kind in _MEDIA_PARTS:
            media = part.get(kind)
            if not isinstance(media, dict) or not isinstance(media.get("url"), str):
                raise Reject("invalid_field")


def _gather_media(parts: list, multi_modal_data: dict) -> None:
    """URL references of user media parts, shaped as Dynamo serializes
    ``MultimodalData::Url`` (``{"Url": url}``), per part type, in order."""
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA_PARTS:
            media = part.get(kind)
            if not isinstance(media, dict) or not isinstance(media.get("url"), str):
                raise Reject("invalid_field")
            multi_modal_data.setdefault(kind, []).append({"Url": media["url"]})


def completion_tokens(model: LoadedModel, request: dict, multi_modal_data: dict) -> list[int]:
    embeds = request.get("prompt_embeds")
    if embeds is not None:
        if not isinstance(embeds, str):
            raise Reject("invalid_field")
        multi_modal_data[PROMPT_EMBEDS_KEY] = embeds
    prompt = request.get("prompt")
    if prompt is None:
        if embeds is not None:
            return []
        raise Reject("missing_prompt")
    vllm = model.template_engine == "jinja2"
    if isinstance(prompt, str):
        return _with_specials(model, request, encode(model, prompt, keep_nul=vllm))
    if not isinstance(prompt, list) or not prompt:
        raise Reject("invalid_field")
    if all(is_int(item) for item in prompt):
        return token_list(prompt)
    if not all(isinstance(item, (str, list)) for item in prompt):
        raise Reject("invalid_field")
    if len(prompt) > 1:
        raise Reject("batch_prompt")
    (single,) = prompt
    if isinstance(single, str):
        return _with_specials(model, request, encode(model, single, keep_nul=vllm))
    return token_list(single)


def _with_specials(model: LoadedModel, request: dict, ids: list[int]) -> list[int]:
    """vLLM encodes a completions text with special tokens unless the request
    says ``add_special_tokens: false`` (Dynamo never adds them)."""
    if model.template_engine != "jinja2" or request.get("add_special_tokens", True) is False:
        return ids
    before, after = model.special_ids
    return [*before, *ids, *after] if before or after else ids


def encode_turn(model: LoadedModel, text: str, resume: Any, shared: int) -> tuple[list[int], Any]:
    """``encode`` of a chat prompt without NULs by the encoder's ``encode_turn``: its
    scan resumes where the conversation's previous prompt's restarted
    (``resume``; ``text`` shares its first ``shared`` characters), and the
    result says where the next turn's may."""
    limit = model.max_prompt_bytes
    if limit is not None and text_over(text, limit):
        raise Reject("prompt_over_budget")
    try:
        return model.prompt_encoder.encode_turn(text, resume, shared)
    except Exception:
        raise Reject("tokenizer_error") from None


def encode(model: LoadedModel, text: str, *, keep_nul: bool = False) -> list[int]:
    """The prompt's ids: incrementally where the model's prompt encoder can (exact,
    ``worker/request/incremental.py``), never past the prompt-bytes budget.
    NULs are stripped first as Dynamo strips them, unless ``keep_nul`` (vLLM)."""
    if "\0" in text and not keep_nul:  # Dynamo strips NULs to avoid tokenizer divergence
        text = text.replace("\0", "")
    limit = model.max_prompt_bytes
    if limit is not None and text_over(text, limit):
        raise Reject("prompt_over_budget")
    encoder = model.prompt_encoder
    try:
        return encoder.encode(text) if encoder is not None else model.encode(text)
    except Exception:
        raise Reject("tokenizer_error") from None


def token_list(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        is_int(token) and 0 <= token < U32 for token in value
    ):
        raise Reject("invalid_field")
    return list(value)
