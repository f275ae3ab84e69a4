"""The configuration file: strict YAML into frozen values (SPEC section 2).

Every error names the file, the line where YAML knows it, the key, what was
expected and what was given, and is raised as ``ConfigError`` (a ``ValueError``);
the command line turns it into exit status 2. Unknown keys are errors: a typo
must not silently mirror more than intended.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import yaml

from shadow_proxy.filters import FilterSet

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
MIB = 1024 * 1024
GIB = 1024 * MIB


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why."""


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


@attrs.frozen
class Config:
    path: str
    upstream: Upstream
    listen: Listen = Listen()
    request_id_header: str = "x-request-id"
    shutdown_grace_s: float = 30.0
    models: tuple[ModelEntry, ...] = ()
    publish: Publish = Publish()
    taps: tuple[TapConfig, ...] = ()
    worker: WorkerOptions = WorkerOptions()
    #: The JetStream connection and stream; set when the file has a ``nats`` section.
    nats: NatsConfig | None = None

    @property
    def capture_response(self) -> bool:
        """Whether any tap needs the response (the serving loop hands it over)."""
        return any(tap.joined for tap in self.taps)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Config:
        """Read and validate the file at ``path``."""
        path = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            msg = f"{path}: cannot read the configuration file ({e.strerror})"
            raise ConfigError(msg) from e
        except UnicodeDecodeError as e:
            msg = f"{path}: the configuration file is not UTF-8"
            raise ConfigError(msg) from e
        return cls.from_text(text, path)

    @classmethod
    def from_text(cls, text: str, path: str = "<config>") -> Config:
        try:
            root = yaml.load(text, Loader=_LineLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else path
            msg = f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})"
            raise ConfigError(msg) from e
        return _Parser(path).config(root)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], path: str = "<config>") -> Config:
        """Build from a plain mapping (tests, the demo)."""
        return cls.from_text(yaml.safe_dump(_plain(mapping)), path)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _Lines(dict):
    """A mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader whose mappings are ``_Lines``: they know where each key stands."""

    def construct_yaml_map(self, node):
        data = _Lines()
        data.line = node.start_mark.line + 1
        data.key_lines = {}
        yield data
        data.update(self.construct_mapping(node))
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            data.key_lines[str(key)] = key_node.start_mark.line + 1


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_yaml_map)


_MISSING = object()


class _Parser:
    """Walks the loaded YAML; each method validates one section."""

    def __init__(self, path: str):
        self.path = path

    # -- helpers ---------------------------------------------------------------

    def fail(self, where: Mapping | None, key: str, expected: str, got: Any = _MISSING) -> None:
        line = getattr(where, "key_lines", {}).get(key.rsplit(".", 1)[-1]) or getattr(
            where, "line", 0
        )
        loc = f"{self.path}:{line}" if line else self.path
        given = "" if got is _MISSING else f" (got {got!r})"
        msg = f"{loc}: '{key}' {expected}{given}"
        raise ConfigError(msg)

    def section(self, parent: Mapping, key: str, prefix: str, allowed: set[str]) -> Mapping:
        value = parent.get(key, _MISSING)
        if value is _MISSING or value is None:
            return _Lines()
        if not isinstance(value, Mapping):
            self.fail(parent, f"{prefix}{key}", "must be a mapping", value)
        self.known(value, f"{prefix}{key}.", allowed)
        return value

    def known(self, mapping: Mapping, prefix: str, allowed: set[str]) -> None:
        for key in mapping:
            if key not in allowed:
                expected = "is not a known key; expected one of " + ", ".join(sorted(allowed))
                self.fail(mapping, f"{prefix}{key}", expected)

    def get(
        self,
        mapping: Mapping,
        key: str,
        prefix: str,
        kind: type | tuple[type, ...],
        default: Any = _MISSING,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        name = f"{prefix}{key}"
        value = mapping.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                self.fail(mapping, name, "is required")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            names = " or ".join(k.__name__ for k in kinds).replace("NoneType", "null")
            names = names.replace("str", "a string").replace("int", "an integer")
            names = names.replace("float", "a number").replace("bool", "true or false")
            self.fail(mapping, name, f"must be {names}", value)
        if check is not None and value is not None:
            problem = check(value)
            if problem:
                self.fail(mapping, name, problem, value)
        return value

    # -- sections --------------------------------------------------------------

    def config(self, root: Any) -> Config:
        if not isinstance(root, Mapping):
            msg = f"{self.path}: the configuration must be a YAML mapping"
            raise ConfigError(msg)
        self.known(
            root,
            "",
            {
                "schema_version",
                "listen",
                "upstream",
                "request_id_header",
                "shutdown_grace_s",
                "models",
                "publish",
                "taps",
                "worker",
                "nats",
            },
        )
        version = root.get("schema_version", _MISSING)
        if version is _MISSING:
            self.fail(root, "schema_version", "is required and must be 1")
        if version != 1 or isinstance(version, bool):
            self.fail(root, "schema_version", "must be 1", version)
        publish = self.publish(root)
        taps = self.taps(root, publish)
        return Config(
            path=self.path,
            listen=self.listen(root),
            upstream=self.upstream(root),
            request_id_header=self.get(
                root, "request_id_header", "", str, "x-request-id", _header_name
            ).lower(),
            shutdown_grace_s=self.get(root, "shutdown_grace_s", "", float, 30.0, _non_negative),
            models=self.models(root),
            publish=publish,
            taps=taps,
            worker=self.worker(root),
            nats=parse_nats_section(self, root, taps),
        )

    def listen(self, root: Mapping) -> Listen:
        s = self.section(root, "listen", "", {"host", "port"})
        return Listen(
            host=self.get(s, "host", "listen.", str, "0.0.0.0"),
            port=self.get(s, "port", "listen.", int, 8080, _port),
        )

    def upstream(self, root: Mapping) -> Upstream:
        if root.get("upstream") is None:
            self.fail(root, "upstream", "is required (a mapping with at least 'url')")
        keys = {
            "url",
            "connect_timeout_s",
            "read_timeout_s",
            "max_connections",
            "max_request_bytes",
        }
        s = self.section(root, "upstream", "", keys)
        p = "upstream."
        return Upstream(
            url=self.get(s, "url", p, str, check=_http_url).rstrip("/"),
            connect_timeout_s=self.get(s, "connect_timeout_s", p, float, 5.0, _positive),
            read_timeout_s=self.get(s, "read_timeout_s", p, (float, type(None)), None, _positive),
            max_connections=self.get(s, "max_connections", p, int, 1024, _at_least_1),
            max_request_bytes=self.get(s, "max_request_bytes", p, int, 64 * MIB, _at_least_1),
        )

    def models(self, root: Mapping) -> tuple[ModelEntry, ...]:
        items = self.get(root, "models", "", (list, type(None)), None) or []
        seen: set[str] = set()
        out = []
        for i, item in enumerate(items):
            p = f"models[{i}]."
            if not isinstance(item, Mapping):
                self.fail(
                    root, f"models[{i}]", "must be a mapping with 'name' and 'tokenizer'", item
                )
            self.known(item, p, {"name", "tokenizer", "context_length"})
            name = self.get(item, "name", p, str, check=_non_empty)
            if name in seen:
                self.fail(item, f"{p}name", "must be unique across models", name)
            seen.add(name)
            out.append(
                ModelEntry(
                    name=name,
                    tokenizer=self.get(item, "tokenizer", p, str, check=_non_empty),
                    context_length=self.get(
                        item, "context_length", p, (int, type(None)), None, _at_least_1
                    ),
                )
            )
        return tuple(out)

    def publish(self, root: Mapping) -> Publish:
        s = self.section(root, "publish", "", {"host", "base_port"})
        return Publish(
            host=self.get(s, "host", "publish.", str, "0.0.0.0"),
            base_port=self.get(s, "base_port", "publish.", int, 5557, _port),
        )

    def worker(self, root: Mapping) -> WorkerOptions:
        keys = {"handoff_capacity", "handoff_max_bytes", "max_in_flight", "nice"}
        s = self.section(root, "worker", "", keys)
        return WorkerOptions(
            handoff_capacity=self.get(s, "handoff_capacity", "worker.", int, 65536, _at_least_1),
            handoff_max_bytes=self.get(
                s, "handoff_max_bytes", "worker.", int, 256 * MIB, _at_least_1
            ),
            max_in_flight=self.get(s, "max_in_flight", "worker.", int, 4096, _at_least_1),
            nice=self.get(s, "nice", "worker.", int, 5, _niceness),
        )

    def taps(self, root: Mapping, publish: Publish) -> tuple[TapConfig, ...]:
        items = self.get(root, "taps", "", (list, type(None)), None) or []
        taps: list[TapConfig] = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                self.fail(root, f"taps[{index}]", "must be a mapping", item)
            taps.append(self.tap(item, index, publish))
        names: dict[str, int] = {}
        endpoints: dict[str, str] = {}
        for tap, item in zip(taps, items, strict=True):
            if tap.name in names:
                self.fail(item, f"taps[{tap.name}].name", "must be unique across taps", tap.name)
            names[tap.name] = 1
            if tap.endpoint in endpoints:
                self.fail(
                    item,
                    f"taps[{tap.name}].endpoint",
                    f"must differ from tap '{endpoints[tap.endpoint]}'s",
                    tap.endpoint,
                )
            endpoints[tap.endpoint] = tap.name
        for a, item in zip(taps, items, strict=True):
            for b in taps:
                if a is b:
                    continue
                if a.topic == b.topic:
                    self.fail(item, f"taps[{a.name}].topic", "must be unique across taps", a.topic)
                if b.topic.startswith(a.topic) and a.transport == b.transport == "zmq":
                    expected = (
                        f"must not be a prefix of tap '{b.name}'s topic '{b.topic}' "
                        "(ZeroMQ subscriptions match by prefix)"
                    )
                    self.fail(item, f"taps[{a.name}].topic", expected, a.topic)
        return tuple(taps)

    def tap(self, item: Mapping, index: int, publish: Publish) -> TapConfig:
        keys = {
            "name",
            "topic",
            "capture",
            "emit",
            "filters",
            "models",
            "sample",
            "sample_by",
            "response",
            "capacity",
            "endpoint",
            "transport",
            "subject",
        }
        raw_name = item.get("name")
        label = raw_name if isinstance(raw_name, str) and raw_name else str(index)
        p = f"taps[{label}]."
        self.known(item, p, keys)
        name = self.get(item, "name", p, str, check=_name)
        topic = self.get(item, "topic", p, str, f"shadow-requests-{name}", _name)
        capture = self.get(item, "capture", p, str, check=_choice("request", "request_response"))
        joined = capture == "request_response"
        if "emit" in item:
            if not joined:
                self.fail(
                    item,
                    f"{p}emit",
                    f"is only allowed with capture: request_response (capture is {capture!r})",
                    item["emit"],
                )
            self.get(item, "emit", p, str, check=_choice("joined"))
        if "response" in item and not joined:
            self.fail(
                item,
                f"{p}response",
                f"is only allowed with capture: request_response (capture is {capture!r})",
                item["response"],
            )
        raw_filters = self.get(item, "filters", p, (list, type(None)), None) or []
        for f in raw_filters:
            if not isinstance(f, str):
                self.fail(item, f"{p}filters", "must be a list of filter names", raw_filters)
        try:
            filters = FilterSet.parse(raw_filters)
        except ValueError as e:
            self.fail(item, f"{p}filters", str(e))
        models = self.get(item, "models", p, (list, type(None)), None) or []
        if not all(isinstance(m, str) and m for m in models):
            self.fail(item, f"{p}models", "must be a list of model names", models)
        endpoint = self.get(
            item,
            "endpoint",
            p,
            str,
            f"tcp://{publish.host}:{publish.base_port + index}",
            _zmq_endpoint,
        )
        transport, subject = parse_tap_transport(self, item, p, topic)
        return TapConfig(
            name=name,
            topic=topic,
            capture=capture,
            endpoint=endpoint,
            filters=filters,
            models=tuple(models),
            sample=self.get(item, "sample", p, float, 1.0, _fraction),
            sample_by=self.get(item, "sample_by", p, str, "request", _choice("request", "prefix")),
            response=self.response(item, p) if joined else None,
            capacity=self.get(item, "capacity", p, int, 1024, _at_least_1),
            transport=transport,
            subject=subject,
        )

    def response(self, item: Mapping, prefix: str) -> ResponseOptions:
        s = self.section(item, "response", prefix, {"tokens", "text", "max_tokens", "chunk_timing"})
        p = f"{prefix}response."
        return ResponseOptions(
            tokens=self.get(s, "tokens", p, bool, True),
            text=self.get(s, "text", p, bool, False),
            max_tokens=self.get(s, "max_tokens", p, (int, type(None)), None, _at_least_1),
            chunk_timing=self.get(s, "chunk_timing", p, bool, False),
        )


# -- the JetStream transport (SPEC section 9) ----------------------------------
#
# Kept apart from ``_Parser`` on purpose: the section is parsed by these two
# functions through the parser's helpers, so it moves as one piece.

NATS_SCHEMES = ("nats", "tls", "ws", "wss")
#: JetStream allows at most five replicas of a stream.
MAX_REPLICAS = 5
_SUBJECT_RE = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_-]+$")


@attrs.frozen
class NatsConfig:
    """Where ``nats`` taps publish: the servers and the stream they keep."""

    servers: tuple[str, ...]
    stream: str = "SHADOW"
    replicas: int = 1
    max_bytes: int = 8 * GIB
    max_age_s: float = 7 * 86400.0
    #: ``old``: a full stream drops its oldest messages; ``new``: refuses new ones.
    discard: str = "old"


def parse_tap_transport(
    parser: _Parser, item: Mapping, prefix: str, topic: str
) -> tuple[str, str | None]:
    """A tap's ``transport`` and ``subject`` (``subject`` only for ``nats``)."""
    transport = parser.get(item, "transport", prefix, str, "zmq", _choice("zmq", "nats"))
    if transport == "zmq":
        if "subject" in item:
            expected = "is only allowed with transport: nats (transport is 'zmq')"
            parser.fail(item, f"{prefix}subject", expected, item["subject"])
        return transport, None
    if "endpoint" in item:
        expected = "is only allowed with transport: zmq (transport is 'nats')"
        parser.fail(item, f"{prefix}endpoint", expected, item["endpoint"])
    subject = parser.get(item, "subject", prefix, str, f"shadow.{topic}", _nats_subject)
    return transport, subject


def parse_nats_section(
    parser: _Parser, root: Mapping, taps: tuple[TapConfig, ...]
) -> NatsConfig | None:
    """The top-level ``nats`` section; required when a tap publishes to NATS."""
    users = [tap for tap in taps if tap.transport == "nats"]
    if root.get("nats") is None:
        if users:
            expected = f"is required when a tap uses transport: nats (tap '{users[0].name}')"
            parser.fail(root, "nats", expected)
        return None
    keys = {"servers", "stream", "replicas", "max_bytes", "max_age_s", "discard"}
    s = parser.section(root, "nats", "", keys)
    p = "nats."
    servers = s.get("servers")
    if not isinstance(servers, list) or not servers:
        expected = "is required: a list of at least one NATS server URL"
        parser.fail(s, f"{p}servers", expected, *(() if servers is None else (servers,)))
    for server in servers:
        problem = _nats_url(server) if isinstance(server, str) else "must list URLs"
        if problem:
            parser.fail(s, f"{p}servers", problem, server)
    config = NatsConfig(
        servers=tuple(servers),
        stream=parser.get(s, "stream", p, str, "SHADOW", _stream_name),
        replicas=parser.get(s, "replicas", p, int, 1, _replicas),
        max_bytes=parser.get(s, "max_bytes", p, int, 8 * GIB, _at_least_1),
        max_age_s=parser.get(s, "max_age_s", p, float, 7 * 86400.0, _positive),
        discard=parser.get(s, "discard", p, str, "old", _choice("old", "new")),
    )
    items = root.get("taps") or []
    seen: dict[str, str] = {}
    for tap, item in zip(taps, items, strict=True):
        if tap.subject is None:
            continue
        name = f"taps[{tap.name}].subject"
        beat = tap.subject + ".heartbeat"
        if tap.subject in seen:
            parser.fail(item, name, "must be unique across taps", tap.subject)
        for other, owner in seen.items():
            if beat == other or other + ".heartbeat" == tap.subject:
                expected = f"must not be, or have as its heartbeat subject, tap '{owner}'s"
                parser.fail(item, name, expected, tap.subject)
        seen[tap.subject] = tap.name
    return config


def _nats_subject(value: str) -> str | None:
    if _SUBJECT_RE.match(value):
        return None
    return "must be a NATS subject: dot-separated tokens, no spaces and no wildcards (* or >)"


def _nats_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in NATS_SCHEMES or not parts.hostname:
        return "must be a NATS server URL such as nats://host:4222"
    return None


def _stream_name(value: str) -> str | None:
    return None if _STREAM_RE.match(value) else "must match [A-Za-z0-9_-]+"


def _replicas(value: int) -> str | None:
    return None if 1 <= value <= MAX_REPLICAS else f"must be between 1 and {MAX_REPLICAS}"


# -- checks: each returns what was expected, or None ---------------------------


def _name(value: str) -> str | None:
    return None if NAME_RE.match(value) else "must match [A-Za-z0-9_-]+"


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def _header_name(value: str) -> str | None:
    return None if re.match(r"^[A-Za-z0-9-]+$", value) else "must be an HTTP header name"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a port number (0 to 65535)"


def _at_least_1(value: int) -> str | None:
    return None if value >= 1 else "must be at least 1"


def _positive(value: float) -> str | None:
    return None if value > 0 and math.isfinite(value) else "must be a positive number"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 and math.isfinite(value) else "must be zero or more"


def _niceness(value: int) -> str | None:
    return None if 0 <= value <= 19 else "must be between 0 and 19"


def _fraction(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must be between 0 and 1"


def _http_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL"
    return None


def _zmq_endpoint(value: str) -> str | None:
    if re.match(r"^(tcp://[^\s/]+:\d+|ipc://\S+|inproc://\S+)$", value):
        return None
    return "must be a ZeroMQ endpoint such as tcp://0.0.0.0:5557 or ipc:///path"


def _choice(*choices: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else "must be one of " + ", ".join(choices)

    return check
