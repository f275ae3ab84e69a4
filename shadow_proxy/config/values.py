"""The configuration's values (SPEC section 2): frozen, with their defaults.

``schema.py`` builds them from a file; everything else only reads them.
"""

from __future__ import annotations

import enum

import attrs

from shadow_proxy.records.filters import FilterSet

MIB = 1024 * 1024


@attrs.frozen
class Listen:
    host: str = "0.0.0.0"
    port: int = 8080
    #: From the end of a request's headers to the end of its body: past this,
    #: the proxy answers 408 and closes (a slow or silent client).
    body_timeout_s: float = 60.0
    #: Client connections open at once; past this a new connection is answered
    #: 503 and closed (counted, logged rate-limited).
    max_connections: int = 8192


@attrs.frozen
class Upstream:
    url: str
    connect_timeout_s: float = 5.0
    #: None: no read timeout (LLM streams may pause for long).
    read_timeout_s: float | None = None
    max_connections: int = 1024
    max_request_bytes: int = 64 * MIB
    #: Ask for a quick ACK once per response (``sockets.ack_now``).
    quick_ack: bool = True


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


@attrs.frozen
class ModelEntry:
    name: str
    tokenizer: str
    context_length: int | None = None
    #: ``minijinja`` (Dynamo's engine and environment) or ``jinja2``
    #: (transformers' sandbox, as vLLM and SGLang render).
    template_engine: TemplateEngine = attrs.field(
        default=TemplateEngine.MINIJINJA, converter=TemplateEngine
    )


@attrs.frozen
class Publish:
    #: Loopback unless configured: records hold the prompts (token ids decode
    #: back to text), so all interfaces is an explicit choice.
    host: str = "127.0.0.1"
    base_port: int = 5557


@attrs.frozen
class CurveKeys:
    """ZeroMQ CURVE for one tap: encryption, and only the listed clients read.

    Paths are resolved against the configuration file's directory.
    """

    #: The tap's key pair: a file written by ``zmq.auth.create_certificates``
    #: (``public-key`` and ``secret-key``), e.g. ``server.key_secret``.
    server_secret_key: str
    #: The public keys allowed to subscribe: one ``.key`` file, or a directory
    #: whose ``*.key`` files each hold one.
    client_keys: str


@attrs.frozen
class ResponseOptions:
    tokens: bool = True
    text: bool = False
    max_tokens: int | None = None
    chunk_timing: bool = False


@attrs.frozen
class TapConfig:
    name: str
    topic: str
    capture: Capture = attrs.field(converter=Capture)
    endpoint: str
    filters: FilterSet
    models: tuple[str, ...] = ()
    sample: float = 1.0
    sample_by: SampleBy = attrs.field(default=SampleBy.REQUEST, converter=SampleBy)
    response: ResponseOptions | None = None
    capacity: int = 1024
    #: ``zmq`` (the tap's PUB socket) or ``nats`` (the JetStream stream, SPEC 9).
    transport: Transport = attrs.field(default=Transport.ZMQ, converter=Transport)
    #: The JetStream subject (``nats`` taps only; ``shadow.{topic}`` by default).
    subject: str | None = None
    #: ZeroMQ CURVE keys (``zmq`` taps only).
    curve: CurveKeys | None = None

    @property
    def joined(self) -> bool:
        return self.capture is Capture.REQUEST_RESPONSE


@attrs.frozen
class WorkerOptions:
    #: No longer used: the hand-off is bounded in bytes (kept so configs that set
    #: it still load).
    handoff_capacity: int = 65536
    #: Bytes the serving loop may have handed off and the worker not yet read;
    #: the worker's main holds at most as much for its shards.
    handoff_max_bytes: int = 256 * MIB
    #: Requests the worker tracks at once (awaiting their response's end),
    #: split evenly across its processes.
    max_in_flight: int = 4096
    #: Joiner processes (shards); None: one per core the sidecar is given
    #: (``os.sched_getaffinity``, capped by the cgroup's CPU quota).
    processes: int | None = None
    #: ``idle``: SCHED_IDLE on every thread of the worker's processes (CPU no
    #: other task wants); ``nice``: only the niceness below.
    priority: Priority = attrs.field(default=Priority.IDLE, converter=Priority)
    #: The niceness with ``priority: nice``, and where the OS has no idle class.
    nice: int = 19
    #: A request or record older than this is given up (dropped as ``late``)
    #: instead of processed late; None: never.
    max_lag_s: float | None = 30.0
    #: Bytes of token ids of prompt segments kept per process for incremental
    #: tokenization, split evenly across models; 0: every prompt encoded in full.
    tokenizer_cache_bytes: int = 64 * MIB
    #: A shard whose resident memory passes this restarts between requests; None: never.
    max_rss_mb: int | None = 1024
    #: Work budget per request (``worker/budget.py``). Prompt text bytes; None:
    #: the model's context length times its longest token's bytes.
    max_prompt_bytes: int | None = None
    #: Bytes a content-encoded response body may decode to.
    max_decoded_bytes: int = 64 * MIB
    #: CPU seconds a shard spends on one request before it stops reading its response.
    max_request_cpu_s: float = 5.0
