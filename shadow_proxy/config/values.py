"""The configuration's values (SPEC section 2): frozen, with their defaults.

``schema.py`` builds them from a file; everything else only reads them.
"""

from __future__ import annotations

import attrs

from shadow_proxy.records.filters import FilterSet

MIB = 1024 * 1024


@attrs.frozen
class Listen:
    host: str = "0.0.0.0"
    port: int = 8080


@attrs.frozen
class Upstream:
    url: str
    connect_timeout_s: float = 5.0
    #: None: no read timeout (LLM streams may pause for long).
    read_timeout_s: float | None = None
    max_connections: int = 1024
    max_request_bytes: int = 64 * MIB


@attrs.frozen
class ModelEntry:
    name: str
    tokenizer: str
    context_length: int | None = None


@attrs.frozen
class Publish:
    host: str = "0.0.0.0"
    base_port: int = 5557


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
    capture: str
    endpoint: str
    filters: FilterSet
    models: tuple[str, ...] = ()
    sample: float = 1.0
    sample_by: str = "request"
    response: ResponseOptions | None = None
    capacity: int = 1024
    #: ``zmq`` (the tap's PUB socket) or ``nats`` (the JetStream stream, SPEC 9).
    transport: str = "zmq"
    #: The JetStream subject (``nats`` taps only; ``shadow.{topic}`` by default).
    subject: str | None = None

    @property
    def joined(self) -> bool:
        return self.capture == "request_response"


@attrs.frozen
class WorkerOptions:
    #: Messages the serving loop may have in flight to the tap worker before a
    #: hand-off is dropped (the ZeroMQ send high-water mark of the hand-off).
    handoff_capacity: int = 65536
    #: Bytes the serving loop may have handed off and the worker not yet read.
    handoff_max_bytes: int = 256 * MIB
    #: Requests the worker tracks at once (awaiting their response's end).
    max_in_flight: int = 4096
    #: Niceness added to the worker process: on a shared core the serving
    #: loop (and the frontend) win; the worker's lag shows as counted drops.
    nice: int = 5
