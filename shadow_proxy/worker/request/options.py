"""Stop conditions, sampling and output options, routing hints, extra arguments
and agent context: the rest of the preprocessed request (SPEC section 3), filled
from the request body and ``nvext`` as a Dynamo frontend fills them. Pure.
"""

from __future__ import annotations

import struct
from typing import Any

from shadow_proxy.worker.request.fields import (
    I32,
    I64,
    U32,
    Reject,
    boolean,
    compact,
    integer,
    mapping,
    number,
    string,
    strings,
)
from shadow_proxy.worker.request.prompt import token_list

_F32 = struct.Struct("<f")


def stop_conditions(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any]:
    max_tokens = integer(request, "max_completion_tokens", 0, U32) if chat else None
    if max_tokens is None:
        max_tokens = integer(request, "max_tokens", 0, U32)
    stop, stop_token_ids = _stop(request.get("stop"), chat=chat)
    if stop_token_ids is None and chat and "stop_token_ids" in request:
        stop_token_ids = token_list(request["stop_token_ids"])
    ignore_eos = boolean(request, "ignore_eos")
    if ignore_eos is None:  # older Dynamo read it from nvext; the top level wins
        ignore_eos = boolean(nvext, "ignore_eos")
    thinking = integer(request, "thinking_token_budget", 0, U32)
    if thinking is None:
        thinking = integer(nvext, "max_thinking_tokens", 0, U32)
    return {
        "max_tokens": max_tokens,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "min_tokens": integer(request, "min_tokens", 0, U32),
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
        return None, token_list(value)
    raise Reject("invalid_field")


def f32(value: float | None) -> float | None:
    """The value as the engine gets it: Dynamo keeps sampling floats as f32
    (a request's 0.7 reaches the engine as 0.699999988079071)."""
    if value is None:
        return None
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except OverflowError:
        raise Reject("invalid_field") from None


def sampling_options(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any]:
    top_k = integer(request, "top_k", -I32, I32)
    if top_k is None:
        top_k = integer(nvext, "top_k", -I32, I32)
    repetition_penalty = number(request, "repetition_penalty")
    if repetition_penalty is None:
        repetition_penalty = number(nvext, "repetition_penalty")
    include_stop = boolean(request, "include_stop_str_in_output")
    options = {
        "n": integer(request, "n", 0, 256),
        "best_of": None if chat else integer(request, "best_of", 0, 256),
        "presence_penalty": f32(number(request, "presence_penalty")),
        "frequency_penalty": f32(number(request, "frequency_penalty")),
        "repetition_penalty": f32(repetition_penalty),
        "temperature": f32(number(request, "temperature")),
        "top_p": f32(number(request, "top_p")),
        "top_k": -1 if top_k == 0 else top_k,
        "min_p": f32(number(request, "min_p")),
        "seed": integer(request, "seed", -I64, I64),
        # Dynamo's frontend never sets use_beam_search or length_penalty, and
        # leaves include_stop_str_in_output unset unless the request sets it.
        "include_stop_str_in_output": include_stop,
        "guided_decoding": _guided_decoding(request, nvext, chat=chat),
    }
    if boolean(nvext, "greed_sampling"):
        options["temperature"] = options["top_p"] = None
    return compact(options)


def _guided_decoding(request: dict, nvext: dict, *, chat: bool) -> dict[str, Any] | None:
    def pick(key: str) -> Any:  # the top level wins over nvext (older Dynamo)
        value = request.get(key)
        return nvext.get(key) if value is None else value

    json_schema = pick("guided_json")
    if json_schema is None and chat:
        json_schema = _response_format_schema(request.get("response_format"))
    if json_schema is None and chat:
        json_schema = _tool_choice_schema(request.get("tool_choice"), request.get("tools"))
    choice = pick("guided_choice")
    if choice is not None and not (
        isinstance(choice, list) and all(isinstance(item, str) for item in choice)
    ):
        raise Reject("invalid_field")
    options = {
        "json": json_schema,
        "regex": string(pick("guided_regex")),
        "choice": choice or None,
        "grammar": string(pick("guided_grammar")),
        "whitespace_pattern": string(pick("guided_whitespace_pattern")),
    }
    if sum(value is not None for value in options.values()) > 1:
        raise Reject("invalid_field")  # Dynamo accepts one kind of guidance only
    if all(value is None for value in options.values()):
        return None
    options["backend"] = string(pick("guided_decoding_backend"))
    return compact(options)


def _tool_choice_schema(choice: Any, tools: Any) -> Any:
    """The JSON schema Dynamo 1.6.1 guides a forced tool call with (measured with
    the recording backend): a named function's ``parameters`` as the client sent
    them; for ``required``, an array of at least one ``{name, parameters}``
    object, one ``anyOf`` branch per tool."""
    if not isinstance(tools, list) or not tools:
        return None
    offered = [t.get("function") for t in tools if isinstance(t, dict)]
    functions: list[dict[str, Any]] = [
        f for f in offered if isinstance(f, dict) and isinstance(f.get("name"), str)
    ]
    if isinstance(choice, dict):
        wanted = choice.get("function")
        name = wanted.get("name") if isinstance(wanted, dict) else None
        for function in functions:
            if function["name"] == name:
                return function.get("parameters") or {}
        raise Reject("invalid_field")  # a named tool that is not offered: a 400
    if choice != "required":
        return None
    branches = [
        {
            "properties": {
                "name": {"type": "string", "enum": [function["name"]]},
                "parameters": function.get("parameters") or {},
            },
            "required": ["name", "parameters"],
        }
        for function in functions
    ]
    return {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}


def _response_format_schema(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Reject("invalid_field")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise Reject("invalid_field")
        return spec.get("schema")
    raise Reject("invalid_field")


def output_options(request: dict, *, chat: bool) -> dict[str, Any]:
    if chat:
        logprobs = None
        if boolean(request, "logprobs"):
            top = integer(request, "top_logprobs", 0, U32)
            logprobs = 1 if top is None else top
        prompt_logprobs = integer(request, "prompt_logprobs", 0, U32)
        as_ids = boolean(request, "return_tokens_as_token_ids")
    else:
        logprobs = integer(request, "logprobs", 0, U32)
        prompt_logprobs = 1 if boolean(request, "echo") else None
        as_ids = None
    # formatted_prompt: Dynamo's providers leave it unset; the rendered prompt
    # goes back to the client as an annotation, never to the engine.
    return compact(
        {
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": boolean(request, "skip_special_tokens"),
            "return_tokens_as_token_ids": as_ids,
        }
    )


# --- nvext -------------------------------------------------------------------

_PINS = {
    "backend_instance_id": U32 * U32,
    "prefill_worker_id": U32 * U32,
    "decode_worker_id": U32 * U32,
    "dp_rank": U32,
    "prefill_dp_rank": U32,
}


def routing(nvext: dict, salt: str | None) -> dict[str, Any]:
    """Dynamo's ``RoutingHints``: worker pins, workload hints from ``agent_hints``,
    the cache salt."""
    routing: dict[str, Any] = {key: integer(nvext, key, 0, bound) for key, bound in _PINS.items()}
    hints = mapping(nvext, "agent_hints") or {}
    priority = integer(hints, "priority", -I32, I32)
    latency = number(hints, "latency_sensitivity")
    routing["expected_output_tokens"] = integer(hints, "osl", 0, U32)
    routing["priority_jump"] = float(max(priority, 0)) if priority is not None else latency
    routing["strict_priority"] = integer(hints, "strict_priority", 0, U32)
    routing["priority"] = priority
    routing["routing_constraints"] = mapping(nvext, "routing_constraints")
    routing["cache_salt"] = salt
    # Dynamo carries nvext.router (latency targets) in a field of its own that
    # PreprocessedRequest lacks; it is a workload hint, kept here.
    routing["router"] = mapping(nvext, "router")
    return compact(routing)


def extra_args(request: dict, nvext: dict) -> dict[str, Any]:
    """Dynamo's backend ``extra_args``: nvext passthrough and sampling passthrough.
    (With media Dynamo also copies ``messages`` and the formatted prompt here;
    left out, as they repeat the prompt and any inline image data.)"""
    passthrough = {
        "extra_fields": strings(nvext, "extra_fields"),
        "cache_salt": cache_salt(request, nvext),
        "metadata_upload": mapping(nvext, "metadata_upload"),
        "token_in": True if nvext.get("token_data") is not None else None,
    }
    sampling = {
        key: request[key]
        for key in ("detokenize", "allowed_token_ids", "bad_words_token_ids")
        if key in request
    }
    if sampling.get("allowed_token_ids") is not None:  # Dynamo: 400 unless token ids
        sampling["allowed_token_ids"] = token_list(sampling["allowed_token_ids"])
    return compact({"nvext": compact(passthrough) or None, "sampling_options": sampling or None})


#: ``nvext`` as Dynamo 1.6.1 reads it: every key and sub-key it knows; any
#: other is a 400 ("unknown field"), so such a request is not mirrored.
NVEXT_FIELDS: dict[str, frozenset[str] | None] = {
    "greed_sampling": None,
    "use_raw_prompt": None,
    "annotations": None,
    "backend_instance_id": None,
    "token_data": None,
    "max_thinking_tokens": None,
    "cache_salt": None,
    "extra_fields": None,
    "metadata_upload": frozenset({"url"}),
    "prefill_worker_id": None,
    "decode_worker_id": None,
    "dp_rank": None,
    "prefill_dp_rank": None,
    "agent_hints": frozenset(
        {"priority", "strict_priority", "osl", "speculative_prefill", "latency_sensitivity"}
    ),
    "request_timestamp_ms": None,
    "routing_constraints": frozenset({"required_taints", "preferred_taints"}),
    "router": frozenset({"ttft_target", "itl_target"}),
}


def check_nvext(nvext: dict) -> None:
    """Reject an ``nvext`` the 1.6.1 frontend refuses (unknown keys at any level)."""
    for key, value in nvext.items():
        if key not in NVEXT_FIELDS:
            raise Reject("invalid_field")
        known = NVEXT_FIELDS[key]
        if known is None or value is None:
            continue
        if not isinstance(value, dict) or not known.issuperset(value):
            raise Reject("invalid_field")


def with_header_overrides(nvext: dict, overrides: dict) -> dict:
    """``nvext`` with the routing headers' values put over the body's."""
    if not overrides:
        return nvext
    merged = {**nvext, **overrides}
    if "agent_hints" in overrides:
        merged["agent_hints"] = {
            **(mapping(nvext, "agent_hints") or {}),
            **overrides["agent_hints"],
        }
    return merged


def cache_salt(request: dict, nvext: dict) -> str | None:
    """The cache salt: ``nvext.cache_salt`` (the tenant header's when given), else the
    top-level ``cache_salt``; blank means absent."""
    for value in (nvext.get("cache_salt"), request.get("cache_salt")):
        if string(value):
            return value
    return None
