"""What a configuration file may hold, and the ``Config`` built from it.

``Config.from_yaml`` reads and validates a file: unknown keys are errors (a
typo must not silently mirror more than intended), every value is typed and
checked, and every error names the file, line, key, expectation and value.
"""

from __future__ import annotations

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
        return _SchemaReader(path).config(load_yaml(text, path))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], path: str = "<config>") -> Config:
        """Build from a plain mapping (tests, the demo)."""
        return cls.from_text(yaml.safe_dump(plain(mapping)), path)


class _SchemaReader(Reader):
    """Each method validates one section of the file."""

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
        taps = self.taps(root, publish)
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
            port=self.get(s, "port", "listen.", int, 8080, checks.port),
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
            url=self.get(s, "url", p, str, check=checks.http_url).rstrip("/"),
            connect_timeout_s=self.get(s, "connect_timeout_s", p, float, 5.0, checks.positive),
            read_timeout_s=self.get(
                s, "read_timeout_s", p, (float, type(None)), None, checks.positive
            ),
            max_connections=self.get(s, "max_connections", p, int, 1024, checks.at_least_1),
            max_request_bytes=self.get(s, "max_request_bytes", p, int, 64 * MIB, checks.at_least_1),
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
            name = self.get(item, "name", p, str, check=checks.non_empty)
            if name in seen:
                self.fail(item, f"{p}name", "must be unique across models", name)
            seen.add(name)
            out.append(
                ModelEntry(
                    name=name,
                    tokenizer=self.get(item, "tokenizer", p, str, check=checks.non_empty),
                    context_length=self.get(
                        item, "context_length", p, (int, type(None)), None, checks.at_least_1
                    ),
                )
            )
        return tuple(out)

    def publish(self, root: Mapping) -> Publish:
        s = self.section(root, "publish", "", {"host", "base_port"})
        return Publish(
            host=self.get(s, "host", "publish.", str, "0.0.0.0"),
            base_port=self.get(s, "base_port", "publish.", int, 5557, checks.port),
        )

    def worker(self, root: Mapping) -> WorkerOptions:
        keys = {"handoff_capacity", "handoff_max_bytes", "max_in_flight", "nice"}
        s = self.section(root, "worker", "", keys)
        return WorkerOptions(
            handoff_capacity=self.get(
                s, "handoff_capacity", "worker.", int, 65536, checks.at_least_1
            ),
            handoff_max_bytes=self.get(
                s, "handoff_max_bytes", "worker.", int, 256 * MIB, checks.at_least_1
            ),
            max_in_flight=self.get(s, "max_in_flight", "worker.", int, 4096, checks.at_least_1),
            nice=self.get(s, "nice", "worker.", int, 5, checks.niceness),
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
