"""Vocabulary shared by the serving loop and the tap worker: routes, end kinds, and
the reasons a request yields no record or a tap loses one.

Pure values, no I/O. The serving loop classifies each request's path into a
``Route`` (a fixed set, so metric labels never take a raw path) and, when the
exchange is over, says how it ended with an ``EndKind``; the worker turns the end
kind plus what it observed into the record's outcome.
"""

from __future__ import annotations

import enum


class Route(enum.IntEnum):
    """What a request path is, as far as the proxy cares."""

    OTHER = 0
    CHAT = 1
    COMPLETIONS = 2
    MODELS = 3
    RESPONSES = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def origin(self) -> str:
        """The envelope's ``origin`` field."""
        return _ORIGINS.get(self, "other")

    @property
    def mirrored(self) -> bool:
        """Whether requests on this route are handed to the taps."""
        return self in _ORIGINS


_ORIGINS = {Route.CHAT: "chat", Route.COMPLETIONS: "completions", Route.RESPONSES: "responses"}
_ROUTES = {
    "/v1/chat/completions": Route.CHAT,
    "/v1/completions": Route.COMPLETIONS,
    "/v1/responses": Route.RESPONSES,
    "/v1/models": Route.MODELS,
}


def classify(method: str, path: str) -> Route:
    """The route of a request. Only POSTs to the generation paths are mirrored."""
    route = _ROUTES.get(path.rstrip("/"), Route.OTHER)
    if route.mirrored and method != "POST":
        return Route.OTHER
    return route


class EndKind(enum.IntEnum):
    """How an exchange ended, as the serving loop saw it."""

    #: The frontend's body ended normally and the client received all of it.
    CLEAN = 0
    #: The client went away before the frontend's body ended.
    CLIENT_GONE = 1
    #: The connection to the frontend broke after the response had started.
    UPSTREAM_BROKEN = 2
    #: A read from the frontend timed out.
    TIMEOUT = 3
    #: The frontend could not be reached or failed before answering; the proxy
    #: answered itself (502 or 504).
    UPSTREAM_FAILED = 4
    #: The proxy shut down with the stream still open (grace period over).
    SHUTDOWN = 5
    #: Part of the exchange could not be handed to the worker (channel full):
    #: the worker cannot build a faithful record.
    CAPTURE_LOST = 6


class NotMirrored(enum.StrEnum):
    """Why a request on a mirrored route yields no record
    (``shadow_not_mirrored_total{reason}``; the serving loop counts ``too_large``
    and ``body_timeout``, the worker the rest). Never client text."""

    #: A Content-Encoding the worker does not decode, or bytes that fail to.
    CONTENT_ENCODING = "content_encoding"
    #: The decoded body exceeds ``upstream.max_request_bytes``.
    BODY_TOO_LARGE = "body_too_large"
    #: The serving loop answered 413 (the worker never sees it).
    TOO_LARGE = "too_large"
    #: The serving loop answered 408.
    BODY_TIMEOUT = "body_timeout"
    NON_UTF8 = "non_utf8"
    #: The body is not JSON (NaN and Infinity included, as serde rejects them).
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    #: No string ``model``.
    MISSING_MODEL = "missing_model"
    #: A model not in the configuration.
    UNKNOWN_MODEL = "unknown_model"
    #: Chat without a non-empty ``messages`` list, responses without ``input``.
    MISSING_MESSAGES = "missing_messages"
    #: Completions without ``prompt`` (or ``prompt_embeds``).
    MISSING_PROMPT = "missing_prompt"
    #: A field of the wrong type or shape; the frontend rejects it too.
    INVALID_FIELD = "invalid_field"
    #: A guard: batches are split into one request per prompt before this.
    BATCH_PROMPT = "batch_prompt"
    #: Prompt text over ``worker.max_prompt_bytes``: not rendered or encoded.
    PROMPT_OVER_BUDGET = "prompt_over_budget"
    #: The chat template failed (``raise_exception`` included) or is missing.
    TEMPLATE_ERROR = "template_error"
    TOKENIZER_ERROR = "tokenizer_error"
    #: Responses: ``previous_response_id``, a prompt the frontend keeps.
    PREVIOUS_RESPONSE = "previous_response"
    #: Responses: ``prompt`` (a stored prompt template), kept by the frontend.
    STORED_PROMPT = "stored_prompt"
    #: Not a chat, completions or responses request.
    UNSUPPORTED_ROUTE = "unsupported_route"
    #: A bug here; logged with the exception type only.
    INTERNAL_ERROR = "internal_error"


class DropReason(enum.StrEnum):
    """Why a tap lost a record (``shadow_tap_dropped_total{reason}``, the heartbeat's
    ``dropped``). Each loss takes the record's seq, so a consumer sees the gap."""

    #: The tap's queue is at capacity (the consumer is slow or stopped).
    FULL = "full"
    #: The publisher is gone (shutdown deadline passed, socket closed).
    CLOSED = "closed"
    #: The serving loop could not hand the request or its response to the worker.
    HANDOFF_FULL = "handoff_full"
    #: The worker tracked too many unfinished requests and gave up on the oldest.
    EVICTED = "evicted"
    #: The record could not be encoded.
    ENCODE_ERROR = "encode_error"
    #: This tap's filters failed on the request (input nested too deep, say).
    PROJECTION_ERROR = "projection_error"
    #: The request or record was older than ``worker.max_lag_s``.
    LATE = "late"
    #: The worker process (or the shard) that held the request died or was
    #: stopped before its record existed.
    WORKER_DIED = "worker_died"
    #: Handling the request failed (a bug) before this tap's record existed.
    WORKER_ERROR = "worker_error"
    #: JetStream taps at close: sent, never acknowledged (it may be in the stream).
    UNACKED = "unacked"


#: The reasons every tap counts from the start (series at 0); ``unacked`` appears
#: on JetStream taps when it happens.
DROP_REASONS = tuple(r for r in DropReason if r is not DropReason.UNACKED)
