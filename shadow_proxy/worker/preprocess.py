"""OpenAI request bytes -> the preprocessed request a Dynamo frontend hands its engine.

Pure module (no aiohttp, no zmq); runs in the tap worker, off the serving loop.
``Preprocessor.preprocess`` never raises: every request yields either a
``PreprocessedRequest`` or a ``NotMirrored`` whose reason comes from a fixed
vocabulary and never carries client text.

Filling rules follow Dynamo's frontend (lib/llm/src/preprocessor.rs and the
OpenAI protocol providers): the chat template renders ``messages`` with the
generation prompt, then the text is encoded *without* special tokens (Dynamo's
HF encoder calls ``encode(text, false)``; the same holds for completions, so a
string prompt gets no BOS either). NUL characters are stripped before encoding,
as Dynamo does.

Measured on this machine (2 cores shared with other jobs, so noisy), median of 9
runs, a system turn plus one long user turn; ids identical in every case.
"render+encode" renders with the compiled template and encodes with the
``tokenizers`` backend; "one call" is ``apply_chat_template(tokenize=True)``::

    model     prompt tokens   render+encode   one call
    deepseek    136            0.17 ms         0.24 ms
    deepseek   2056            6.8 ms          7.2 ms
    deepseek  16392           22.8 ms         23.1 ms
    chatml      173            0.22 ms         0.26 ms
    chatml     2093            2.4 ms          2.6 ms
    chatml    16433           19.4 ms         19.4 ms

Encoding dominates long prompts; the one call adds a fixed ~0.05-0.4 ms of
message normalization and BatchEncoding work (and logs a warning past the
tokenizer's model_max_length). So the template is rendered by our own sandbox,
compiled once per model with transformers' settings and helpers, and the text is
encoded by the backend.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import attrs

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.tokenizer import LoadedModel

log = logging.getLogger(__name__)

NOT_MIRRORED_REASONS: tuple[str, ...] = (
    "non_utf8",  # the body is not UTF-8
    "invalid_json",  # the body is not JSON (NaN and Infinity included, as serde rejects them)
    "not_an_object",  # the JSON is not an object
    "missing_model",  # no string `model`
    "unknown_model",  # a model not in the configuration
    "missing_messages",  # chat without a non-empty `messages` list
    "missing_prompt",  # completions without `prompt` (or `prompt_embeds`)
    "invalid_field",  # a field of the wrong type or shape; the frontend rejects it too
    "batch_prompt",  # completions with several prompts: one engine request each
    "prompt_too_long",  # prompt fills the context; the frontend rejects it
    "template_error",  # the chat template failed (raise_exception included) or is missing
    "tokenizer_error",  # the tokenizer failed
    "unsupported_route",  # not a chat or completions request
    "internal_error",  # a bug here; logged with the exception type only
)

#: Key of ``multi_modal_data`` that holds completions' ``prompt_embeds`` (base64).
#: Dynamo keeps them in a top-level ``prompt_embeds`` field that
#: ``PreprocessedRequest`` lacks; here they count as multimodal data, so that
#: ``skip-multimodal`` skips them, and ``strip-embeds`` removes this key.
PROMPT_EMBEDS_KEY = "prompt_embeds"

_MEDIA_PARTS = ("image_url", "video_url", "audio_url")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_U32 = 2**32
_I32 = 2**31
_I64 = 2**63


@attrs.frozen
class NotMirrored:
    """A request that yields no record, and why (a value of ``NOT_MIRRORED_REASONS``)."""

    reason: str = attrs.field(validator=attrs.validators.in_(NOT_MIRRORED_REASONS))


class _Reject(Exception):
    """Internal: stop preprocessing with a reason from the vocabulary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _reject_constant(_name: str) -> None:
    raise _Reject("invalid_json")


class Preprocessor:
    """Builds the engine's view of chat and completions requests for the loaded models."""

    def __init__(self, models: Mapping[str, LoadedModel]) -> None:
        self._models = dict(models)

    def preprocess(
        self, route: Route, body: bytes, arrival_unix_ns: int
    ) -> PreprocessedRequest | NotMirrored:
        """The preprocessed request, or why there is none. Never raises."""
        try:
            return self._preprocess(route, body, arrival_unix_ns)
        except _Reject as reject:
            return NotMirrored(reject.reason)
        except RecursionError:
            return NotMirrored("invalid_json")
        except Exception as exc:  # a bug here must cost the client nothing
            log.error("preprocess failed unexpectedly: %s", type(exc).__name__)
            return NotMirrored("internal_error")

    def _preprocess(self, route: Route, body: bytes, arrival_unix_ns: int) -> PreprocessedRequest:
        if route not in (Route.CHAT, Route.COMPLETIONS):
            raise _Reject("unsupported_route")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise _Reject("non_utf8") from None
        try:
            request = json.loads(text, parse_constant=_reject_constant)
        except ValueError:
            raise _Reject("invalid_json") from None
        if not isinstance(request, dict):
            raise _Reject("not_an_object")
        name = request.get("model")
        if not isinstance(name, str):
            raise _Reject("missing_model")
        model = self._models.get(name)
        if model is None:
            raise _Reject("unknown_model")
        nvext = _obj(request, "nvext") or {}
        chat = route is Route.CHAT

        multi_modal_data: dict[str, Any] = {}
        if chat:
            token_ids = _chat_tokens(model, request, nvext, multi_modal_data)
        else:
            token_ids = _completion_tokens(model, request, multi_modal_data)
        if model.context_length and len(token_ids) >= model.context_length:
            raise _Reject("prompt_too_long")

        stop = _stop_conditions(request, nvext, chat=chat)
        ignore_eos = bool(stop.get("ignore_eos"))
        if ignore_eos:  # Dynamo's apply_ignore_eos: no stop strings or ids at all
            for key in ("stop", "stop_token_ids", "stop_token_ids_hidden"):
                stop.pop(key, None)
        else:
            stop["stop_token_ids_hidden"] = list(model.eos_token_ids)
        # As Dynamo: with images the token ids hold unexpanded placeholders, so
        # the default is left to the engine.
        has_images = bool(multi_modal_data.get("image_url"))
        if stop.get("max_tokens") is None and model.context_length and not has_images:
            stop["max_tokens"] = max(0, model.context_length - len(token_ids))

        timestamp = _num(nvext, "request_timestamp_ms")
        return PreprocessedRequest(
            model=name,
            token_ids=token_ids,
            stop_conditions=_compact(stop),
            sampling_options=_sampling_options(request, nvext, chat=chat),
            output_options=_output_options(request, chat=chat),
            eos_token_ids=[] if ignore_eos else list(model.eos_token_ids),
            annotations=_str_list(nvext, "annotations") or [],
            routing=_routing(nvext) if "nvext" in request else {},
            extra_args=_extra_args(request, nvext),
            multi_modal_data=multi_modal_data,
            agent_context=_agent_context(request, nvext),
            mdc_sum=model.mdc_sum,
            request_timestamp_ms=arrival_unix_ns // 1_000_000 if timestamp is None else timestamp,
        )


# --- prompt ------------------------------------------------------------------


def _chat_tokens(
    model: LoadedModel, request: dict, nvext: dict, multi_modal_data: dict
) -> list[int]:
    messages = request.get("messages")
    if messages is None or messages == []:
        raise _Reject("missing_messages")
    if not isinstance(messages, list):
        raise _Reject("invalid_field")
    for message in messages:
        _check_message(message)
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            _gather_media(message["content"], multi_modal_data)
    tools = request.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)
    ):
        raise _Reject("invalid_field")
    token_data = _token_list(nvext.get("token_data")) if "token_data" in nvext else None
    if token_data is not None:  # pre-tokenized by an external router: Dynamo skips encoding
        return token_data
    if model.chat_template is None:
        raise _Reject("template_error")
    if request.get("tool_choice") == "none":
        tools = None  # Dynamo's default (--exclude-tools-when-tool-choice-none)
    context = {
        **model.template_globals,
        **_template_kwargs(request),
        "messages": _template_messages(messages),
        "tools": tools,
        "documents": None,
        "add_generation_prompt": True,
    }
    try:
        text = model.chat_template.render(context)
    except Exception:
        raise _Reject("template_error") from None
    return _encode(model, text)


def _check_message(message: Any) -> None:
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise _Reject("invalid_field")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _Reject("invalid_field")
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _Reject("invalid_field")
        kind = part["type"]
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _Reject("invalid_field")
        if kind in _MEDIA_PARTS:
            media = part.get(kind)
            if not isinstance(media, dict) or not isinstance(media.get("url"), str):
                raise _Reject("invalid_field")


def _gather_media(parts: list, multi_modal_data: dict) -> None:
    """URL references of user media parts, shaped as Dynamo serializes
    ``MultimodalData::Url`` (``{"Url": url}``), per part type, in order."""
    for part in parts:
        kind = part["type"]
        if kind in _MEDIA_PARTS:
            multi_modal_data.setdefault(kind, []).append({"Url": part[kind]["url"]})


def _template_messages(messages: list[dict]) -> list[dict]:
    """Messages as Dynamo hands them to templates: keys with None values dropped,
    reasoning under its usual aliases, content made only of text parts joined
    into one string with newlines, tool-call arguments parsed from their JSON
    string into an object."""
    result = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        content = message.get("content")
        if isinstance(content, list) and all(part.get("type") == "text" for part in content):
            message["content"] = "\n".join(part["text"] for part in content)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [_parsed_arguments(call) for call in message["tool_calls"]]
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        result.append(message)
    return result


def _parsed_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str) or not arguments:
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise _Reject("invalid_field") from None  # Dynamo answers 400
    if not isinstance(parsed, dict):
        raise _Reject("invalid_field")
    return {**call, "function": {**function, "arguments": parsed}}


def _template_kwargs(request: dict) -> dict[str, Any]:
    """``chat_template_kwargs`` (alias ``chat_template_args``) plus Dynamo's folding of
    ``thinking`` and ``reasoning_effort`` into them."""
    kwargs = _obj(request, "chat_template_kwargs")
    if kwargs is None:
        kwargs = _obj(request, "chat_template_args")
    kwargs = dict(kwargs or {})
    thinking = request.get("thinking")
    if thinking is not None:
        mode = thinking if isinstance(thinking, bool) else None
        if isinstance(thinking, dict):
            mode = {"enabled": True, "disabled": False, "adaptive": "adaptive"}.get(
                thinking.get("type"), "invalid"
            )
        if mode is None or mode == "invalid":
            raise _Reject("invalid_field")
        if mode == "adaptive":
            kwargs["thinking_mode"] = "adaptive"
        else:
            kwargs["thinking"] = mode
            kwargs["thinking_mode"] = "enabled" if mode else "disabled"
    effort = request.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _Reject("invalid_field")
        kwargs.setdefault("enable_thinking", effort != "none")
        kwargs["reasoning_effort"] = effort
    return kwargs


def _completion_tokens(model: LoadedModel, request: dict, multi_modal_data: dict) -> list[int]:
    embeds = request.get("prompt_embeds")
    if embeds is not None:
        if not isinstance(embeds, str):
            raise _Reject("invalid_field")
        multi_modal_data[PROMPT_EMBEDS_KEY] = embeds
    prompt = request.get("prompt")
    if prompt is None:
        if embeds is not None:
            return []
        raise _Reject("missing_prompt")
    if isinstance(prompt, str):
        return _encode(model, prompt)
    if not isinstance(prompt, list) or not prompt:
        raise _Reject("invalid_field")
    if all(_is_int(item) for item in prompt):
        return _token_list(prompt)
    if not all(isinstance(item, (str, list)) for item in prompt):
        raise _Reject("invalid_field")
    if len(prompt) > 1:
        raise _Reject("batch_prompt")
    (single,) = prompt
    return _encode(model, single) if isinstance(single, str) else _token_list(single)


def _encode(model: LoadedModel, text: str) -> list[int]:
    if "\0" in text:  # Dynamo strips NULs to avoid tokenizer divergence
        text = text.replace("\0", "")
    try:
        return model.encode(text)
    except Exception:
        raise _Reject("tokenizer_error") from None


def _token_list(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        _is_int(token) and 0 <= token < _U32 for token in value
    ):
        raise _Reject("invalid_field")
    return list(value)


# --- options -----------------------------------------------------------------


def _stop_conditions(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any]:
    max_tokens = _int(request, "max_completion_tokens", 0, _U32) if chat else None
    if max_tokens is None:
        max_tokens = _int(request, "max_tokens", 0, _U32)
    stop, stop_token_ids = _stop(request.get("stop"), chat=chat)
    if stop_token_ids is None and chat and "stop_token_ids" in request:
        stop_token_ids = _token_list(request["stop_token_ids"])
    ignore_eos = _bool(request, "ignore_eos")
    if ignore_eos is None:  # older Dynamo read it from nvext; the top level wins
        ignore_eos = _bool(nvext, "ignore_eos")
    thinking = _int(request, "thinking_token_budget", 0, _U32)
    if thinking is None:
        thinking = _int(nvext, "max_thinking_tokens", 0, _U32)
    return {
        "max_tokens": max_tokens,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "min_tokens": _int(request, "min_tokens", 0, _U32),
        "ignore_eos": ignore_eos,
        "max_thinking_tokens": thinking,
    }


def _stop(value: Any, *, chat: bool) -> tuple[list[str] | None, list[int] | None]:
    """``stop`` as strings, or (chat only, as Dynamo) as token ids."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return [value], None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value), None
    if chat and isinstance(value, list) and value:
        return None, _token_list(value)
    raise _Reject("invalid_field")


def _sampling_options(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any]:
    top_k = _int(request, "top_k", -_I32, _I32)
    if top_k is None:
        top_k = _int(nvext, "top_k", -_I32, _I32)
    repetition_penalty = _num(request, "repetition_penalty")
    if repetition_penalty is None:
        repetition_penalty = _num(nvext, "repetition_penalty")
    include_stop = _bool(request, "include_stop_str_in_output")
    options = {
        "n": _int(request, "n", 0, 256),
        "best_of": None if chat else _int(request, "best_of", 0, 256),
        "presence_penalty": _num(request, "presence_penalty"),
        "frequency_penalty": _num(request, "frequency_penalty"),
        "repetition_penalty": repetition_penalty,
        "temperature": _num(request, "temperature"),
        "top_p": _num(request, "top_p"),
        "top_k": -1 if top_k == 0 else top_k,
        "min_p": _num(request, "min_p"),
        "seed": _int(request, "seed", -_I64, _I64),
        # Dynamo's frontend never sets use_beam_search or length_penalty.
        # Its serde default for include_stop_str_in_output is false.
        "include_stop_str_in_output": False if include_stop is None else include_stop,
        "guided_decoding": _guided_decoding(request, nvext, chat=chat),
    }
    if _bool(nvext, "greed_sampling"):
        options["temperature"] = options["top_p"] = None
    return _compact(options)


def _guided_decoding(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any] | None:
    def pick(key: str) -> Any:  # the top level wins over nvext (older Dynamo)
        value = request.get(key)
        return nvext.get(key) if value is None else value

    json_schema = pick("guided_json")
    if json_schema is None and chat:
        json_schema = _response_format_schema(request.get("response_format"))
    choice = pick("guided_choice")
    if choice is not None and not (
        isinstance(choice, list) and all(isinstance(item, str) for item in choice)
    ):
        raise _Reject("invalid_field")
    options = {
        "json": json_schema,
        "regex": _str_value(pick("guided_regex")),
        "choice": choice or None,
        "grammar": _str_value(pick("guided_grammar")),
        "whitespace_pattern": _str_value(pick("guided_whitespace_pattern")),
    }
    if sum(value is not None for value in options.values()) > 1:
        raise _Reject("invalid_field")  # Dynamo accepts one kind of guidance only
    if all(value is None for value in options.values()):
        return None
    options["backend"] = _str_value(pick("guided_decoding_backend"))
    return _compact(options)


def _response_format_schema(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Reject("invalid_field")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise _Reject("invalid_field")
        return spec.get("schema")
    raise _Reject("invalid_field")


def _output_options(request: dict, *, chat: bool) -> dict[str, Any]:
    if chat:
        logprobs = None
        if _bool(request, "logprobs"):
            top = _int(request, "top_logprobs", 0, _U32)
            logprobs = 1 if top is None else top
        prompt_logprobs = _int(request, "prompt_logprobs", 0, _U32)
        as_ids = _bool(request, "return_tokens_as_token_ids")
    else:
        logprobs = _int(request, "logprobs", 0, _U32)
        prompt_logprobs = 1 if _bool(request, "echo") else None
        as_ids = None
    # formatted_prompt: Dynamo's providers leave it unset; the rendered prompt
    # goes back to the client as an annotation, never to the engine.
    return _compact(
        {
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": _bool(request, "skip_special_tokens"),
            "return_tokens_as_token_ids": as_ids,
        }
    )


# --- nvext -------------------------------------------------------------------

_PINS = {
    "backend_instance_id": _U32 * _U32,
    "prefill_worker_id": _U32 * _U32,
    "decode_worker_id": _U32 * _U32,
    "dp_rank": _U32,
    "prefill_dp_rank": _U32,
}


def _routing(nvext: dict) -> dict[str, Any]:
    """Dynamo's ``RoutingHints``: worker pins, plus workload hints from ``agent_hints``."""
    routing: dict[str, Any] = {key: _int(nvext, key, 0, bound) for key, bound in _PINS.items()}
    hints = _obj(nvext, "agent_hints") or {}
    priority = _int(hints, "priority", -_I32, _I32)
    latency = _num(hints, "latency_sensitivity")
    routing["expected_output_tokens"] = _int(hints, "osl", 0, _U32)
    routing["priority_jump"] = float(max(priority, 0)) if priority is not None else latency
    routing["strict_priority"] = _int(hints, "strict_priority", 0, _U32)
    routing["priority"] = priority
    routing["routing_constraints"] = _obj(nvext, "routing_constraints")
    # Dynamo carries nvext.router (latency targets) in a field of its own that
    # PreprocessedRequest lacks; it is a workload hint, kept here.
    routing["router"] = _obj(nvext, "router")
    return _compact(routing)


def _extra_args(request: dict, nvext: dict) -> dict[str, Any]:
    """Dynamo's backend ``extra_args``: nvext passthrough and sampling passthrough.
    (With media Dynamo also copies ``messages`` and the formatted prompt here;
    left out, as they repeat the prompt and any inline image data.)"""
    passthrough = {
        "extra_fields": _str_list(nvext, "extra_fields"),
        "cache_salt": _str_value(nvext.get("cache_salt")),
        "metadata_upload": _obj(nvext, "metadata_upload"),
        "token_in": True if nvext.get("token_data") is not None else None,
    }
    if passthrough["cache_salt"] is None:
        passthrough["cache_salt"] = _str_value(request.get("cache_salt"))
    sampling = {
        key: request[key]
        for key in ("detokenize", "allowed_token_ids", "bad_words_token_ids")
        if key in request
    }
    return _compact({"nvext": _compact(passthrough) or None, "sampling_options": sampling or None})


def _agent_context(request: dict, nvext: dict) -> dict[str, Any]:
    """Session identity. Dynamo takes it from agent harness headers, which the
    hand-off does not carry; the body forms it also accepts are read here:
    an ``agent_context`` object, else ``nvext.session_control.session_id``."""
    context = _obj(request, "agent_context") or _obj(nvext, "agent_context")
    if context is not None:
        if not isinstance(context.get("session_id"), str):
            raise _Reject("invalid_field")
        keys = ("session_id", "parent_session_id", "session_final", "compaction", "kv_hints")
        return _compact({key: context.get(key) for key in keys})
    session = _obj(nvext, "session_control")
    if session is not None:
        session_id = session.get("session_id")
        if not isinstance(session_id, str):
            raise _Reject("invalid_field")
        return {"session_id": session_id}
    return {}


# --- typed field access: a wrong type is "invalid_field" ------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(obj: dict, key: str, low: int, high: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not _is_int(value) or not low <= value < high:
        raise _Reject("invalid_field")
    return value


def _num(obj: dict, key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Reject("invalid_field")
    return float(value)


def _bool(obj: dict, key: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise _Reject("invalid_field")
    return value


def _obj(obj: dict, key: str) -> dict | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise _Reject("invalid_field")
    return value


def _str_value(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _Reject("invalid_field")
    return value


def _str_list(obj: dict, key: str) -> list[str] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Reject("invalid_field")
    return list(value)


def _compact(values: dict[str, Any]) -> dict[str, Any]:
    """The dict without its unset (None) entries."""
    return {key: value for key, value in values.items() if value is not None}
