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

The template is rendered by the model's own renderer (``templates/``: MiniJinja
as Dynamo renders, or jinja2 where ``template_engine`` says the frontend does)
and the text is encoded by the ``tokenizers`` backend, not through
``apply_chat_template(tokenize=True)`` (which adds message normalization and
BatchEncoding work, and warns past ``model_max_length``). What it costs per
prompt length: ``bench/bench_preprocess.py`` (figures in docs/benchmarks.md, "What it
costs").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request import batch, identity, options, responses, vllm_responses
from shadow_proxy.worker.request.body import decode_body, parse_body
from shadow_proxy.worker.request.fields import (
    NotMirrored,
    Reject,
    compact,
    mapping,
    number,
    strings,
)
from shadow_proxy.worker.request.identity import Headers
from shadow_proxy.worker.request.prompt import chat_tokens, completion_tokens
from shadow_proxy.worker.request.tokenizer import LoadedModel

log = logging.getLogger(__name__)

#: Top-level fields the 1.6.1 frontend refuses with 400 ("Unsupported
#: parameter"): session identity is never read from the body.
_REJECTED_FIELDS = ("agent_context", "session_id", "conversation_id", "safety_identifier")


class Preprocessor:
    """Builds the engine's view of chat, completions and responses requests for the
    loaded models."""

    def __init__(
        self, models: Mapping[str, LoadedModel], max_body_bytes: int = 64 * 1024 * 1024
    ) -> None:
        self._models = dict(models)
        #: Bound on a decoded (decompressed) body: ``upstream.max_request_bytes``.
        self.max_body_bytes = max_body_bytes

    def preprocess(
        self,
        route: Route,
        body: bytes,
        arrival_unix_ns: int,
        headers: Sequence[tuple[str, str]] = (),
        content_encoding: str = "",
    ) -> PreprocessedRequest | batch.PreprocessedBatch | NotMirrored:
        """The preprocessed request (one per prompt for batch completions), or
        why there is none. Never raises.

        ``body`` is as the client sent it; ``content_encoding`` its header.
        ``headers``: the allow-listed request headers (``channel.headers``),
        which fill ``agent_context``, ``image_cache_scope``, routing overrides
        and the cache salt as Dynamo fills them (``identity.py``)."""
        try:
            if content_encoding:
                body = decode_body(body, content_encoding, self.max_body_bytes)
            return self._preprocess(route, body, arrival_unix_ns, Headers(list(headers)))
        except Reject as reject:
            return NotMirrored(reject.reason)
        except RecursionError:
            return NotMirrored("invalid_json")
        except Exception as exc:  # a bug here must cost the client nothing
            log.error("preprocess failed unexpectedly: %s", type(exc).__name__)
            return NotMirrored("internal_error")

    def _preprocess(
        self, route: Route, body: bytes, arrival_unix_ns: int, headers: Headers
    ) -> PreprocessedRequest | batch.PreprocessedBatch:
        if route not in (Route.CHAT, Route.COMPLETIONS, Route.RESPONSES):
            raise Reject("unsupported_route")
        request = parse_body(body)
        name = request.get("model")
        if not isinstance(name, str):
            raise Reject("missing_model")
        model = self._models.get(name)
        if model is None:
            raise Reject("unknown_model")
        if route is Route.RESPONSES:  # rebuilt as the chat request the frontend makes of it
            if model.template_engine == "jinja2":
                request = vllm_responses.chat_request(request)
            else:
                request = responses.chat_request(request)
        if route is Route.COMPLETIONS and (many := batch.prompts(request)) is not None:
            return batch.PreprocessedBatch(
                tuple(
                    self._engine_request(
                        route, model, {**request, "prompt": p}, arrival_unix_ns, headers
                    )
                    for p in many
                )
            )
        return self._engine_request(route, model, request, arrival_unix_ns, headers)

    def _engine_request(
        self,
        route: Route,
        model: LoadedModel,
        request: dict,
        arrival_unix_ns: int,
        headers: Headers,
    ) -> PreprocessedRequest:
        name = request["model"]
        nvext = mapping(request, "nvext") or {}
        options.check_nvext(nvext)
        if any(key in request for key in _REJECTED_FIELDS):
            raise Reject("invalid_field")
        nvext = options.with_header_overrides(nvext, identity.routing_overrides(headers))
        chat = route is not Route.COMPLETIONS

        multi_modal_data: dict[str, Any] = {}
        spans = None
        context = identity.agent_context(headers, request, chat=chat)
        if chat:
            # A request that names its session comes back to this shard for its next turn.
            conversation = bool(context)
            token_ids, spans = chat_tokens(model, request, nvext, multi_modal_data, conversation)
        else:
            token_ids = completion_tokens(model, request, multi_modal_data)

        stop = options.stop_conditions(request, nvext, chat=chat)
        ignore_eos = bool(stop.get("ignore_eos"))
        if ignore_eos:  # Dynamo's apply_ignore_eos: no stop strings or ids at all
            for key in ("stop", "stop_token_ids", "stop_token_ids_hidden"):
                stop.pop(key, None)
        else:
            stop["stop_token_ids_hidden"] = list(model.eos_token_ids)
        # max_tokens omitted stays unset: Dynamo 1.6.1 leaves it to the engine.

        timestamp = number(nvext, "request_timestamp_ms")
        return PreprocessedRequest(
            model=name,
            token_ids=token_ids,
            stop_conditions=compact(stop),
            sampling_options=options.sampling_options(request, nvext, chat=chat),
            output_options=options.output_options(request, chat=chat),
            eos_token_ids=[] if ignore_eos else list(model.eos_token_ids),
            annotations=strings(nvext, "annotations") or [],
            routing=options.routing(nvext, options.cache_salt(request, nvext)),
            extra_args=options.extra_args(request, nvext),
            multi_modal_data=multi_modal_data,
            agent_context=context,
            image_cache_scope=context.get("session_id"),
            mdc_sum=model.mdc_sum,
            request_timestamp_ms=arrival_unix_ns // 1_000_000 if timestamp is None else timestamp,
            prompt_spans=spans,
        )
