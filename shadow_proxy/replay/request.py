"""A record -> the request the candidate receives (SPEC section 11, "Request").

Pure: no socket, no clock. ``build_request`` runs once per record the scheduler
takes; it either returns the ``CandidateRequest`` (body and headers of a
``POST /v1/completions``) or a ``Skip`` whose ``reason`` is one of
``SKIP_REASONS``, a fixed vocabulary safe as a counter key.

The record's ``request`` is the preprocessed request as the engine saw it, so
the candidate gets the prompt as token ids (no chat template, no tokenizer on
the candidate's path) and the options the engine used, each sent in the field
its frontend reads:

==========================  ==================================================
record field                request field (Dynamo 1.6.1 / vLLM / SGLang)
==========================  ==================================================
token_ids                   ``prompt`` (list of ints; all three accept it)
stop_conditions.max_tokens  ``max_tokens``
stop_conditions.stop        ``stop`` (strings)
stop_conditions.stop_token_ids  ``stop_token_ids`` (vLLM, SGLang; chat-only
                            in Dynamo, which ignores it on completions)
stop_conditions.min_tokens  ``min_tokens`` (top level: Dynamo's ``CommonExt``,
                            vLLM's and SGLang's completion request)
stop_conditions.ignore_eos  ``ignore_eos`` (top level in all three; Dynamo's
                            ``nvext.ignore_eos`` is deprecated, top level wins)
stop_conditions.max_thinking_tokens  ``nvext.max_thinking_tokens`` (Dynamo
                            1.6.1 answers 400 to a top-level
                            ``thinking_token_budget`` on completions)
sampling_options.*          ``n``, ``best_of``, ``temperature``, ``top_p``,
                            ``presence_penalty``, ``frequency_penalty``,
                            ``seed`` (OpenAI fields); ``top_k``, ``min_p``,
                            ``repetition_penalty`` (top level; Dynamo's
                            ``CommonExt``, vLLM and SGLang extra params);
                            ``include_stop_str_in_output`` (only when true)
sampling_options.guided_decoding  ``guided_json`` / ``guided_regex`` /
                            ``guided_choice`` / ``guided_grammar`` /
                            ``guided_whitespace_pattern`` /
                            ``guided_decoding_backend`` (Dynamo's CommonExt)
output_options.logprobs     ``logprobs`` (completions: an integer)
extra_args.sampling_options ``detokenize``, ``allowed_token_ids``,
                            ``bad_words_token_ids`` as they were sent
==========================  ==================================================

Dynamo 1.6.1 answers 400 to an unknown top-level field and to an unknown
``nvext`` key, so only fields the record holds are sent, and nothing is
duplicated into ``nvext``. Headers (``CandidateRequest.headers_for``): each
target gets a request id of its own in ``request_id_header`` (``x-request-id``:
vLLM takes it as its request id, Dynamo logs and echoes it), the record's id
with the target's name as a suffix (``{request_id}-candidate``,
``{request_id}-baseline``), so that the candidate and the baseline never carry
the same id at the same moment (one deployment serving both would refuse the
second: Dynamo answers 503 "Unlinked request" to an id already in flight); the
record's own id goes in ``ORIGINAL_REQUEST_ID_HEADER``, to join with the
primary's logs. Dynamo's deprecated ``x-dynamo-request-id`` is not sent (Dynamo
1.6.1 warns on every request that carries it, and makes its own ids). SGLang
reads a body ``rid`` that Dynamo rejects; it is not sent.

Not sent: ``stop_token_ids_hidden`` and ``eos_token_ids`` (the candidate's own
model card decides them, as the primary's did), routing pins (wrong for another
deployment), annotations, ``echo``/``prompt_logprobs`` (they would change the
output being compared). ``top_k`` is sent as recorded (-1: disabled).

Why a record may not be replayed (``Skip.reason``):

- ``invalid_record``: not an envelope this tool can read (required fields,
  types);
- ``no_token_ids``: the record has no prompt token ids;
- ``multimodal``: the prompt's token ids hold unexpanded media placeholders,
  the images themselves are not in the record;
- ``no_response``: a request-only record while comparing (``--no-compare``
  replays it for load);
- ``late``: the scheduler could not send it within ``--max-lag-s`` (decided in
  ``schedule``, listed here so the vocabulary is in one place).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from shadow_proxy.records.envelope import record_id

COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
DEFAULT_REQUEST_ID_HEADER = "x-request-id"
#: The record's own request id, beside the target's (``{request_id}-{target}``).
ORIGINAL_REQUEST_ID_HEADER = "x-shadow-original-request-id"

SKIP_REASONS = ("invalid_record", "no_token_ids", "multimodal", "no_response", "late")

#: Sampling options sent under the same name, when the record holds them.
_SAMPLING_FIELDS = (
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
)
_GUIDED_FIELDS = {
    "json": "guided_json",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
    "whitespace_pattern": "guided_whitespace_pattern",
    "backend": "guided_decoding_backend",
}
_PASSTHROUGH_SAMPLING = ("detokenize", "allowed_token_ids", "bad_words_token_ids")


@attrs.frozen
class Skip:
    """A record that is not sent; ``reason`` is one of ``SKIP_REASONS``."""

    reason: str
    request_id: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.reason not in SKIP_REASONS:
            msg = f"'reason' must be one of {SKIP_REASONS} (got {self.reason!r})"
            raise ValueError(msg)


@attrs.frozen
class CandidateRequest:
    """What is POSTed to ``{base}/v1/completions`` for one record."""

    #: The record's request id (a batch's prompt: ``{request_id}-{prompt_index}``).
    request_id: str
    body: Mapping[str, Any]
    #: The prompt's length, kept for the progress line and the report.
    prompt_tokens: int
    request_id_header: str = DEFAULT_REQUEST_ID_HEADER

    def sent_id(self, target: str) -> str:
        """The request id ``target`` (``candidate`` or ``baseline``) gets."""
        return f"{self.request_id}-{target}"

    def headers_for(self, target: str) -> dict[str, str]:
        """The headers of the request sent to ``target``."""
        return {
            self.request_id_header: self.sent_id(target),
            ORIGINAL_REQUEST_ID_HEADER: self.request_id,
        }


def build_request(
    envelope: Mapping[str, Any],
    *,
    model: str | None = None,
    compare: bool = True,
    request_id_header: str = DEFAULT_REQUEST_ID_HEADER,
) -> CandidateRequest | Skip:
    """The candidate's request for one record, or why there is none.

    ``model`` replaces the record's model name; ``compare`` False accepts
    request-only records (replay for load).
    """
    request_id = envelope.get("request_id")
    request = envelope.get("request")
    if not isinstance(request_id, str) or not isinstance(request, Mapping):
        return Skip("invalid_record", request_id if isinstance(request_id, str) else None)
    request_id = record_id(envelope)  # a batch's prompts: one request (and id) each
    token_ids = request.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        return Skip("no_token_ids", request_id)
    if request.get("multi_modal_data"):
        return Skip("multimodal", request_id)
    response = envelope.get("response")
    if compare and not isinstance(response, Mapping):
        return Skip("no_response", request_id)
    name = model if model is not None else request.get("model")
    if not isinstance(name, str) or not name:
        return Skip("invalid_record", request_id)

    body: dict[str, Any] = {
        "model": name,
        "prompt": token_ids,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(_stop_fields(_mapping(request, "stop_conditions")))
    body.update(_sampling_fields(_mapping(request, "sampling_options")))
    logprobs = _mapping(request, "output_options").get("logprobs")
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):
        body["logprobs"] = logprobs
    passthrough = _mapping(_mapping(request, "extra_args"), "sampling_options")
    body.update({k: passthrough[k] for k in _PASSTHROUGH_SAMPLING if k in passthrough})
    return CandidateRequest(
        request_id=request_id,
        body=body,
        prompt_tokens=len(token_ids),
        request_id_header=request_id_header,
    )


def _mapping(container: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = container.get(key)
    return value if isinstance(value, Mapping) else {}


def _stop_fields(stop: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("max_tokens", "min_tokens"):
        if isinstance(stop.get(key), int):
            out[key] = stop[key]
    if stop.get("stop"):
        out["stop"] = list(stop["stop"])
    if stop.get("stop_token_ids"):
        out["stop_token_ids"] = list(stop["stop_token_ids"])
    if stop.get("ignore_eos") is True:
        out["ignore_eos"] = True
    if isinstance(stop.get("max_thinking_tokens"), int):
        out["nvext"] = {"max_thinking_tokens": stop["max_thinking_tokens"]}
    return out


def _sampling_fields(sampling: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: sampling[k] for k in _SAMPLING_FIELDS if sampling.get(k) is not None}
    if sampling.get("include_stop_str_in_output") is True:
        out["include_stop_str_in_output"] = True
    guided = sampling.get("guided_decoding")
    if isinstance(guided, Mapping):
        out.update({_GUIDED_FIELDS[k]: v for k, v in guided.items() if k in _GUIDED_FIELDS})
    return out
