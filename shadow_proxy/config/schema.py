"""What a configuration file may hold, and the ``Config`` built from it.

``Config.from_yaml`` reads and validates a file: unknown keys are errors (a
typo must not silently mirror more than intended), every value is typed and
checked, and every error names the file, line, key, expectation and value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from shadow_proxy.config import reader as checks
from shadow_proxy.config.nats import NatsConfig, parse_nats_section, parse_tap_transport
from shadow_proxy.config.reader import MISSING, ConfigError, Reader, load_yaml, plain
from shadow_proxy.config.values import (
    MIB,
    TEMPLATE_ENGINES,
    CurveKeys,
    Listen,
    ModelEntry,
    Publish,
    ResponseOptions,
    TapConfig,
    Upstream,
    WorkerOptions,
)
from shadow_proxy.records.filters import FilterSet


@attrs.frozen
class Config:
    path: str
    upstream: Upstream
    listen: Listen = attrs.field(factory=Listen)
    request_id_header: str = "x-request-id"
    shutdown_grace_s: float = 30.0
    models: tuple[ModelEntry, ...] = ()
    publish: Publish = attrs.field(factory=Publish)
    taps: tuple[TapConfig, ...] = ()
    worker: WorkerOptions = attrs.field(factory=WorkerOptions)
    #: The JetStream connection and stream; set when the file has a ``nats`` section.
    nats: NatsConfig | None = None
    #: The line of each key read (``listen.port``, ``models[0].tokenizer``,
    #: ``taps[a].endpoint``): for errors found after reading (``where``).
    lines: Mapping[str, int] = attrs.field(factory=dict, eq=False, repr=False)

    def where(self, key: str) -> str:
        """``file:line: 'key'`` for an error about a value found after reading
        (a port in use, a tokenizer that does not load). Without the key's own
        line, its section's (``taps[a]`` for ``taps[a].endpoint``)."""
        line, parent = self.lines.get(key), key
        while line is None and "." in parent:
            parent = parent.rsplit(".", 1)[0]
            line = self.lines.get(parent)
        return f"{self.path}:{line}: '{key}'" if line else f"{self.path}: '{key}'"

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
        return cls.from_text(text, path, base_dir=Path(path).resolve().parent)

    @classmethod
    def from_text(cls, text: str, path: str = "<config>", base_dir: Path | None = None) -> Config:
        """Read ``text``; relative paths in it (tokenizers, key files) are read
        from ``base_dir`` (the file's directory), else from the working directory."""
        return _SchemaReader(path, base_dir).config(load_yaml(text, path))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], path: str = "<config>") -> Config:
        """Build from a plain mapping (tests, the demo)."""
        return cls.from_text(yaml.safe_dump(plain(mapping)), path)


class _SchemaReader(Reader):
    """Each method validates one section of the file."""

    def __init__(self, path: str, base_dir: Path | None):
        super().__init__(path)
        self.base_dir = base_dir

    def local_path(self, value: str) -> Path:
        """``value`` as a path: ``~`` expanded, relative to the file's directory."""
        path = Path(value).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        # ``..`` folded, symlinks kept (a Kubernetes Secret mount is symlinks).
        return Path(os.path.normpath(path))

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
        version = root.get("schema_version", MISSING)
        if version is MISSING:
            self.fail(root, "schema_version", "is required and must be 1")
        if version != 1 or isinstance(version, bool):
            self.fail(root, "schema_version", "must be 1", version)
        publish = self.publish(root)
        models = self.models(root)
        taps = self.taps(root, publish, models)
        return Config(
            path=self.path,
            listen=self.listen(root),
            upstream=self.upstream(root),
            request_id_header=self.get(
                root, "request_id_header", "", str, "x-request-id", checks.header_name
            ).lower(),
            shutdown_grace_s=self.get(
                root, "shutdown_grace_s", "", float, 30.0, checks.non_negative
            ),
            models=models,
            publish=publish,
            taps=taps,
            worker=self.worker(root),
            nats=parse_nats_section(self, root, taps),
            lines=self.lines,
        )

    def listen(self, root: Mapping) -> Listen:
        s = self.section(root, "listen", "", {"host", "port", "body_timeout_s", "max_connections"})
        p = "listen."
        return Listen(
            host=self.get(s, "host", p, str, "0.0.0.0"),
            port=self.get(s, "port", p, int, 8080, checks.port),
            body_timeout_s=self.get(s, "body_timeout_s", p, float, 60.0, checks.positive),
            max_connections=self.get(s, "max_connections", p, int, 8192, checks.at_least_1),
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
            "quick_ack",
        }
        s = self.section(root, "upstream", "", keys)
        p = "upstream."
        return Upstream(
            url=self.get(s, "url", p, str, check=checks.http_url).rstrip("/"),
            connect_timeout_s=self.get(s, "connect_timeout_s", p, float, 5.0, checks.positive),
            read_timeout_s=self.get(
                s, "read_timeout_s", p, (float, type(None)), None, checks.positive
            ),
            max_connections=self.get(s, "max_connections", p, int, 1024, checks.at_least_1),
            max_request_bytes=self.get(s, "max_request_bytes", p, int, 64 * MIB, checks.at_least_1),
            quick_ack=self.get(s, "quick_ack", p, bool, True),
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
            self.known(item, p, {"name", "tokenizer", "context_length", "template_engine"})
            name = self.get(item, "name", p, str, check=checks.non_empty)
            if name in seen:
                self.fail(item, f"{p}name", "must be unique across models", name)
            seen.add(name)
            out.append(
                ModelEntry(
                    name=name,
                    tokenizer=self.tokenizer(item, p),
                    context_length=self.get(
                        item, "context_length", p, (int, type(None)), None, checks.at_least_1
                    ),
                    template_engine=self.get(
                        item, "template_engine", p, str, "minijinja", _template_engine
                    ),
                )
            )
        return tuple(out)

    def tokenizer(self, item: Mapping, prefix: str) -> str:
        """A local directory, relative to the file's directory, or a hub id
        (``name`` or ``org/name``, looked up in the local cache by the worker).
        A value shaped like a path (``./``, ``../``, ``/``, ``~``, or more than
        one ``/``) is always a path. The worker reports a missing directory,
        with this key's line (``Config.where``)."""
        value = self.get(item, "tokenizer", prefix, str, check=checks.non_empty)
        path = self.local_path(value)
        hub_id = not value.startswith((".", "/", "~")) and value.count("/") <= 1
        return value if hub_id and not path.exists() else str(path)

    def publish(self, root: Mapping) -> Publish:
        s = self.section(root, "publish", "", {"host", "base_port"})
        return Publish(
            host=self.get(s, "host", "publish.", str, "127.0.0.1"),
            base_port=self.get(s, "base_port", "publish.", int, 5557, checks.port),
        )

    def worker(self, root: Mapping) -> WorkerOptions:
        keys = {
            "handoff_capacity", "handoff_max_bytes", "max_in_flight", "processes", "priority",
            "nice", "max_lag_s", "tokenizer_cache_bytes", "max_rss_mb", "max_prompt_bytes",
            "max_decoded_bytes", "max_request_cpu_s",
        }  # fmt: skip
        s = self.section(root, "worker", "", keys)
        p = "worker."
        optional_int = (int, type(None))
        return WorkerOptions(
            handoff_capacity=self.get(s, "handoff_capacity", p, int, 65536, checks.at_least_1),
            handoff_max_bytes=self.get(
                s, "handoff_max_bytes", p, int, 256 * MIB, checks.at_least_1
            ),
            max_in_flight=self.get(s, "max_in_flight", p, int, 4096, checks.at_least_1),
            processes=self.get(s, "processes", p, optional_int, None, checks.at_least_1),
            priority=self.get(s, "priority", p, str, "idle", checks.choice("idle", "nice")),
            nice=self.get(s, "nice", p, int, 19, checks.niceness),
            max_lag_s=self.get(s, "max_lag_s", p, (float, type(None)), 30.0, checks.positive),
            tokenizer_cache_bytes=self.get(
                s, "tokenizer_cache_bytes", p, int, 64 * MIB, checks.non_negative
            ),
            max_rss_mb=self.get(s, "max_rss_mb", p, optional_int, 1024, checks.at_least_1),
            max_prompt_bytes=self.get(
                s, "max_prompt_bytes", p, optional_int, None, checks.at_least_1
            ),
            max_decoded_bytes=self.get(s, "max_decoded_bytes", p, int, 64 * MIB, checks.at_least_1),
            max_request_cpu_s=self.get(s, "max_request_cpu_s", p, float, 5.0, checks.positive),
        )

    def taps(
        self, root: Mapping, publish: Publish, models: tuple[ModelEntry, ...]
    ) -> tuple[TapConfig, ...]:
        items = self.get(root, "taps", "", (list, type(None)), None) or []
        taps: list[TapConfig] = []
        model_names = tuple(m.name for m in models)
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                self.fail(root, f"taps[{index}]", "must be a mapping", item)
            taps.append(self.tap(item, index, publish, model_names))
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

    def tap(
        self, item: Mapping, index: int, publish: Publish, model_names: tuple[str, ...]
    ) -> TapConfig:
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
            "curve",
        }
        raw_name = item.get("name")
        label = raw_name if isinstance(raw_name, str) and raw_name else str(index)
        p = f"taps[{label}]."
        self.known(item, p, keys)
        if getattr(item, "line", 0):
            self.lines[f"taps[{label}]"] = item.line
        name = self.get(item, "name", p, str, check=checks.name)
        topic = self.get(item, "topic", p, str, f"shadow-requests-{name}", checks.name)
        capture = self.get(
            item, "capture", p, str, check=checks.choice("request", "request_response")
        )
        joined = capture == "request_response"
        if "emit" in item:
            if not joined:
                self.fail(
                    item,
                    f"{p}emit",
                    f"is only allowed with capture: request_response (capture is {capture!r})",
                    item["emit"],
                )
            self.get(item, "emit", p, str, check=checks.choice("joined"))
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
        for model in models:
            if model not in model_names:
                configured = ", ".join(model_names) if model_names else "none"
                expected = (
                    f"must name configured models (models: {configured}); "
                    f"'{model}' is not one, so the tap would never mirror it"
                )
                self.fail(item, f"{p}models", expected, models)
        endpoint = self.get(
            item,
            "endpoint",
            p,
            str,
            f"tcp://{publish.host}:{publish.base_port + index}",
            checks.zmq_endpoint,
        )
        transport, subject = parse_tap_transport(self, item, p, topic)
        return TapConfig(
            name=name,
            topic=topic,
            capture=capture,
            endpoint=endpoint,
            filters=filters,
            models=tuple(models),
            sample=self.get(item, "sample", p, float, 1.0, checks.fraction),
            sample_by=self.get(
                item, "sample_by", p, str, "request", checks.choice("request", "prefix")
            ),
            response=self.response(item, p) if joined else None,
            capacity=self.get(item, "capacity", p, int, 1024, checks.at_least_1),
            transport=transport,
            subject=subject,
            curve=self.curve(item, p, transport) if item.get("curve") is not None else None,
        )

    def curve(self, item: Mapping, prefix: str, transport: str) -> CurveKeys:
        if transport != "zmq":
            expected = f"is only for ZeroMQ taps (transport is {transport!r})"
            self.fail(item, f"{prefix}curve", expected)
        s = self.section(item, "curve", prefix, {"server_secret_key", "client_keys"})
        p = f"{prefix}curve."
        secret = self.get(s, "server_secret_key", p, str, check=checks.non_empty)
        clients = self.get(s, "client_keys", p, str, check=checks.non_empty)
        # Read by the worker at start-up (a missing file fails start-up there,
        # with this key's line): a deployment mounts them from a Secret.
        return CurveKeys(
            server_secret_key=str(self.local_path(secret)),
            client_keys=str(self.local_path(clients)),
        )

    def response(self, item: Mapping, prefix: str) -> ResponseOptions:
        s = self.section(item, "response", prefix, {"tokens", "text", "max_tokens", "chunk_timing"})
        p = f"{prefix}response."
        return ResponseOptions(
            tokens=self.get(s, "tokens", p, bool, True),
            text=self.get(s, "text", p, bool, False),
            max_tokens=self.get(s, "max_tokens", p, (int, type(None)), None, checks.at_least_1),
            chunk_timing=self.get(s, "chunk_timing", p, bool, False),
        )


# -- checks: each returns what was expected, or None ---------------------------


def _template_engine(value: str) -> str | None:
    if value in TEMPLATE_ENGINES:
        return None
    engines = ", ".join(TEMPLATE_ENGINES)
    return f"must be one of {engines} (minijinja: Dynamo 1.6.1; jinja2: vLLM 0.32)"
