"""The configuration's values (SPEC section 2): frozen, each key defined once.

Every field made with ``keys.key`` is a key of the file: its name, type,
default, check and doc are here and nowhere else; the reader
(``reader.Reader.read``), the docs table and the example configuration
(``docs.py``) read them. ``schema.py`` reads the lists (models, taps) and what
spans keys; everything else only reads the values.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from shadow_proxy.config import reader as checks
from shadow_proxy.config.choices import (
    TEMPLATE_ENGINES,
    Capture,
    Emit,
    Priority,
    SampleBy,
    TemplateEngine,
    Transport,
)
from shadow_proxy.config.keys import key
from shadow_proxy.records.filters import FilterSet

MIB = 1024 * 1024


class Context(Protocol):
    """What the reader knows around a key (``schema.py``): the file's directory,
    the ``publish`` section, the tap's index."""

    publish: Publish
    index: int

    def local_path(self, value: str) -> Path: ...

    def tokenizer(self, value: str) -> str: ...


def _template_engine(value: str) -> str | None:
    if value in TEMPLATE_ENGINES:
        return None
    engines = ", ".join(TEMPLATE_ENGINES)
    return f"must be one of {engines} (minijinja: Dynamo 1.6.1; jinja2: vLLM 0.32)"


def _path(value: str, context: Context) -> str:
    return str(context.local_path(value))


@attrs.frozen
class Listen:
    host: str = key("Address the proxy listens on.", "0.0.0.0")
    port: int = key("Clients point here instead of the frontend.", 8080, check=checks.port)
    #: From the end of a request's headers to the end of its body: past this,
    #: the proxy answers 408 and closes (a slow or silent client).
    body_timeout_s: float = key(
        "A request body must arrive within this after its headers, else 408.",
        60.0,
        check=checks.positive,
    )
    #: Client connections open at once; past this a new connection is answered
    #: 503 and closed (counted, logged rate-limited).
    max_connections: int = key(
        "Client connections at once; past it a new one gets 503 and is closed.",
        8192,
        check=checks.at_least_1,
    )


@attrs.frozen
class Upstream:
    url: str = key(
        "The OpenAI-compatible frontend's base URL (Dynamo, vLLM, SGLang, ...).",
        check=checks.http_url,
        parse=lambda value, _: value.rstrip("/"),
        example="http://127.0.0.1:8000",
    )
    connect_timeout_s: float = key(
        "504 when the frontend does not accept a connection in time.", 5.0, check=checks.positive
    )
    #: None: no read timeout (LLM streams may pause for long).
    read_timeout_s: float | None = key(
        "Longest pause between the frontend's bytes; null: none (streams may pause long).",
        None,
        check=checks.positive,
    )
    max_connections: int = key(
        "Bound of the connection pool to the frontend.", 1024, check=checks.at_least_1
    )
    max_request_bytes: int = key(
        "Largest request body (decoded, for the worker's copy); 413 above.",
        64 * MIB,
        check=checks.at_least_1,
    )
    #: Ask for a quick ACK once per response (``sockets.ack_now``).
    quick_ack: bool = key(
        "A quick ACK per response on pooled connections: no delayed-ACK stall (Linux).", True
    )


@attrs.frozen
class ModelEntry:
    name: str = key("The served model name, as requests name it.", check=checks.non_empty)
    tokenizer: str = key(
        "A local tokenizer directory (Hugging Face layout), relative to this file, or a hub "
        "id found in the local cache.",
        check=checks.non_empty,
        parse=lambda value, context: context.tokenizer(value),
    )
    context_length: int | None = key(
        "The model's context length; null: config.json's max_position_embeddings.",
        None,
        check=checks.at_least_1,
    )
    #: ``minijinja`` (Dynamo's engine and environment) or ``jinja2``
    #: (transformers' sandbox, as vLLM 0.32 renders; checked token-exact in
    #: tests/integration/test_vllm.py).
    template_engine: TemplateEngine = key(
        "How the chat template is rendered: as the frontend does (minijinja: Dynamo 1.6.1; "
        "jinja2: vLLM 0.32).",
        TemplateEngine.MINIJINJA,
        converter=TemplateEngine,
        check=_template_engine,
    )


@attrs.frozen
class Publish:
    #: Loopback unless configured: records hold the prompts (token ids decode
    #: back to text), so all interfaces is an explicit choice.
    host: str = key(
        "Where taps bind; loopback unless consumers elsewhere need them (records hold the "
        "prompts: then 0.0.0.0 and a curve per tap).",
        "127.0.0.1",
    )
    base_port: int = key(
        "Tap i binds tcp://host:(base_port + i) unless it names an endpoint.",
        5557,
        check=checks.port,
    )


@attrs.frozen
class CurveKeys:
    """ZeroMQ CURVE for one tap: encryption, and only the listed clients read.

    Paths are resolved against the configuration file's directory.
    """

    #: The tap's key pair: a file written by ``zmq.auth.create_certificates``
    #: (``public-key`` and ``secret-key``), e.g. ``server.key_secret``.
    server_secret_key: str = key(
        "The tap's key pair, a zmq.auth.create_certificates file (server.key_secret).",
        check=checks.non_empty,
        parse=_path,
        example="keys/server.key_secret",
    )
    #: The public keys allowed to subscribe: one ``.key`` file, or a directory
    #: whose ``*.key`` files each hold one.
    client_keys: str = key(
        "The public keys allowed to subscribe: one .key file, or a directory of them.",
        check=checks.non_empty,
        parse=_path,
        example="keys/allowed",
    )


@attrs.frozen
class ResponseOptions:
    tokens: bool = key("Record output token ids per choice.", True)
    text: bool = key("Record output text per choice.", False)
    max_tokens: int | None = key(
        "Cap on recorded ids per choice (then truncated: true); null: none.",
        None,
        check=checks.at_least_1,
    )
    chunk_timing: bool = key("An arrival offset per content-carrying chunk.", False)


def _only_joined(values: Mapping[str, Any]) -> str | None:
    capture = values["capture"]
    if capture is Capture.REQUEST_RESPONSE:
        return None
    return f"is only allowed with capture: request_response (capture is '{capture}')"


def _only_transport(transport: Transport) -> Any:
    def allowed(values: Mapping[str, Any]) -> str | None:
        given = values["transport"]
        if given is transport:
            return None
        return f"is only allowed with transport: {transport} (transport is '{given}')"

    return allowed


def _only_zmq_curve(values: Mapping[str, Any]) -> str | None:
    given = values["transport"]
    return None if given is Transport.ZMQ else f"is only for ZeroMQ taps (transport is '{given}')"


def _strings(what: str) -> Any:
    def check(values: list[Any]) -> str | None:
        return (
            None if all(isinstance(v, str) and v for v in values) else f"must be a list of {what}"
        )

    return check


def _filters(value: Any, _: Any) -> FilterSet:
    return value if isinstance(value, FilterSet) else FilterSet.parse(list(value))


def _joined_response(values: Mapping[str, Any], _: Any) -> ResponseOptions | None:
    return ResponseOptions() if values["capture"] is Capture.REQUEST_RESPONSE else None


def _nats_subject(values: Mapping[str, Any], _: Any) -> str | None:
    return f"shadow.{values['topic']}" if values["transport"] is Transport.NATS else None


def _endpoint(values: Mapping[str, Any], context: Context) -> str:
    return f"tcp://{context.publish.host}:{context.publish.base_port + context.index}"


@attrs.frozen
class TapConfig:
    name: str = key("Unique; [A-Za-z0-9_-]+.", check=checks.name)
    topic: str = key(
        "Unique, none a prefix of another ZeroMQ tap's (subscriptions match by prefix).",
        check=checks.name,
        derive=lambda values, _: f"shadow-requests-{values['name']}",
        default_doc="shadow-requests-{name}",
    )
    capture: Capture = key(
        "request: a record as soon as the request is preprocessed; request_response: one "
        "joined record when the response ends.",
        converter=Capture,
    )
    endpoint: str = key(
        "The tap's ZeroMQ endpoint (transport: zmq).",
        check=checks.zmq_endpoint,
        derive=_endpoint,
        default_doc="tcp://{publish.host}:{publish.base_port + index}",
        allowed=_only_transport(Transport.ZMQ),
    )
    filters: FilterSet = key(
        "What leaves the proxy (SPEC 5): strip-*, tokens-only, skip-multimodal, "
        "max-tokens=N; strip-worker-pins is on unless keep-worker-pins.",
        factory=lambda: FilterSet.parse([]),
        yaml=list,
        check=_strings("filter names"),
        parse=_filters,
        example=(),
    )
    models: tuple[str, ...] = key(
        "Mirror only these configured models; empty: all.", (), check=_strings("model names")
    )
    sample: float = key(
        "Fraction mirrored, decided by a hash of sample_by's key: a smaller fraction "
        "mirrors a subset of a larger one.",
        1.0,
        check=checks.fraction,
    )
    sample_by: SampleBy = key(
        "request: the request id; prefix: the first 64 prompt tokens (keeps conversations "
        "whole, and a shadow's KV-cache hit rate true).",
        SampleBy.REQUEST,
        converter=SampleBy,
    )
    response: ResponseOptions | None = key(
        "What a joined record keeps of the response (capture: request_response).",
        None,
        derive=_joined_response,
        default_doc="its defaults with capture: request_response",
        allowed=_only_joined,
    )
    capacity: int = key(
        "The tap's queue bound, also its ZeroMQ send high-water mark.",
        1024,
        check=checks.at_least_1,
    )
    #: ``zmq`` (the tap's PUB socket) or ``nats`` (the JetStream stream, SPEC 9).
    transport: Transport = key(
        "zmq: the tap's PUB socket; nats: the JetStream stream (the nats section).",
        Transport.ZMQ,
        converter=Transport,
    )
    #: The JetStream subject (``nats`` taps only; ``shadow.{topic}`` by default).
    subject: str | None = key(
        "The JetStream subject (transport: nats).",
        None,
        check=checks.nats_subject,
        derive=_nats_subject,
        default_doc="shadow.{topic}",
        allowed=_only_transport(Transport.NATS),
    )
    #: ZeroMQ CURVE keys (``zmq`` taps only).
    curve: CurveKeys | None = key(
        "ZeroMQ CURVE: encrypted, and only the listed consumers read (transport: zmq).",
        None,
        allowed=_only_zmq_curve,
    )
    #: SPEC 3: a ``request_response`` tap emits joined records (the only kind).
    emit: Emit | None = key(
        "What a request_response tap emits: joined records (SPEC: the only kind).",
        None,
        allowed=_only_joined,
    )

    @property
    def joined(self) -> bool:
        return self.capture is Capture.REQUEST_RESPONSE


@attrs.frozen
class WorkerOptions:
    #: Bytes the serving loop may have handed off and the worker not yet read;
    #: the worker's main holds at most as much for its shards.
    handoff_max_bytes: int = key(
        "Bytes handed off and not yet read by the worker (its main holds as much again for "
        "its shards); past it a request is dropped, counted.",
        256 * MIB,
        check=checks.at_least_1,
    )
    #: Requests the worker tracks at once (awaiting their response's end),
    #: split evenly across its processes.
    max_in_flight: int = key(
        "Unfinished requests the worker tracks, split across its shards.",
        4096,
        check=checks.at_least_1,
    )
    #: Joiner processes; None: one per core given (``sched_getaffinity``, cgroup quota).
    processes: int | None = key(
        "Joiner shards; null: one per core given (CPU affinity, cgroup quota).",
        None,
        check=checks.at_least_1,
    )
    priority: Priority = key(
        "idle: SCHED_IDLE on every worker thread (CPU nothing else wants); nice: only nice.",
        Priority.IDLE,
        converter=Priority,
    )
    nice: int = key(
        "The niceness with priority: nice, or where the OS has no idle class.",
        19,
        check=checks.niceness,
    )
    malloc: str = key(
        "auto: jemalloc, else mimalloc, preloaded in the worker's processes when the machine "
        "has one; system: the C library's malloc; or a malloc library's absolute path.",
        "auto",
        check=checks.malloc,
    )
    max_lag_s: float | None = key(
        "Older requests and records are dropped (late), not published late; null: never.",
        30.0,
        check=checks.positive,
    )
    #: Prompt segments' ids kept per process, split across models; 0: full encodes.
    tokenizer_cache_bytes: int = key(
        "Per shard: prompt segments' token ids reused (0: every prompt encoded in full).",
        64 * MIB,
        check=checks.non_negative,
    )
    #: ``worker/request/turn_cache.py``, split evenly across models.
    turn_cache_bytes: int = key(
        "Per shard: conversations' previous prompts kept for their next turns (0: off).",
        64 * MIB,
        check=checks.non_negative,
    )
    max_rss_mb: int | None = key(
        "A shard above this is replaced between requests; null: never.",
        1024,
        check=checks.at_least_1,
    )
    #: Prompt text bytes per request (``worker/budget.py``); None: from the context length.
    max_prompt_bytes: int | None = key(
        "Prompt text bytes rendered and encoded at most; null: context length x 32 bytes "
        "per token, per model.",
        None,
        check=checks.at_least_1,
    )
    max_decoded_bytes: int = key(
        "A gzip/deflate/br/zstd response body decodes to at most this.",
        64 * MIB,
        check=checks.at_least_1,
    )
    max_request_cpu_s: float = key(
        "A shard reads no more of a response past this CPU time.", 5.0, check=checks.positive
    )
