"""What a configuration key may choose from: ``enum.StrEnum``s whose values are the
strings the file holds (and the records, metrics and listings show). Pure."""

from __future__ import annotations

import enum


class TemplateEngine(enum.StrEnum):
    """How a model's chat template is rendered: as the frontend in front of it does."""

    #: Dynamo's engine and environment.
    MINIJINJA = "minijinja"
    #: transformers' sandbox, as vLLM and SGLang render.
    JINJA2 = "jinja2"


class Capture(enum.StrEnum):
    """What a tap records."""

    #: The request, published as soon as it is preprocessed.
    REQUEST = "request"
    #: One joined record when the response ends.
    REQUEST_RESPONSE = "request_response"


class Emit(enum.StrEnum):
    """What a ``request_response`` tap emits (SPEC: only joined records)."""

    JOINED = "joined"


class SampleBy(enum.StrEnum):
    """The key a tap's sample is decided by."""

    #: The request id.
    REQUEST = "request"
    #: The first 64 prompt tokens: a conversation's turns are kept or skipped together.
    PREFIX = "prefix"


class Transport(enum.StrEnum):
    """Where a tap publishes."""

    #: Its own ZeroMQ PUB socket.
    ZMQ = "zmq"
    #: The JetStream stream (SPEC 9).
    NATS = "nats"


class Priority(enum.StrEnum):
    """The scheduling class of the tap worker's threads."""

    #: SCHED_IDLE: CPU no other task wants.
    IDLE = "idle"
    #: Only the niceness ``worker.nice``.
    NICE = "nice"


#: The template engines' names, for messages.
TEMPLATE_ENGINES = tuple(TemplateEngine)
