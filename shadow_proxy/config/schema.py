"""The ``Config`` a file is read into, and what spans its keys.

``Config.from_yaml`` reads and validates a file: unknown keys are errors (a
typo must not silently mirror more than intended), every value is typed and
checked, and every error names the file, line, key, expectation and value.
Each key is defined once, as a field of its value class (``values.py``,
``nats.py``; ``keys.py`` says how); this module reads the lists (models, taps)
and checks what one key cannot: names, endpoints and topics unique across taps,
a tap's models configured, a topic no prefix of another ZeroMQ tap's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from shadow_proxy.config import reader as checks
from shadow_proxy.config.keys import key, keys
from shadow_proxy.config.nats import NatsConfig, parse_nats_section
from shadow_proxy.config.reader import MISSING, ConfigError, Reader, load_yaml, plain
from shadow_proxy.config.values import (
    Listen,
    ModelEntry,
    Publish,
    TapConfig,
    Transport,
    Upstream,
    WorkerOptions,
)


@attrs.frozen(kw_only=True)
class Config:
    path: str = attrs.field()
    #: The file format's version (SPEC 2: 1; checked by the reader before the rest).
    schema_version: int = key("The file format's version: 1.", 1)
    listen: Listen = key("Where clients connect.", factory=Listen)
    upstream: Upstream = key(
        "The frontend the proxy stands in front of.",
        required="is required (a mapping with at least 'url')",
    )
    request_id_header: str = key(
        "Taken from the client when present, else generated and sent upstream, so that the "
        "frontend's logs and the records join on one id.",
        "x-request-id",
        check=checks.header_name,
        parse=lambda value, _: value.lower(),
    )
    shutdown_grace_s: float = key(
        "At SIGTERM, in-flight streams get this long to finish.", 30.0, check=checks.non_negative
    )
    models: tuple[ModelEntry, ...] = key(
        "Served model name -> its tokenizer (loaded once at start-up).", ()
    )
    publish: Publish = key("Where the ZeroMQ taps bind by default.", factory=Publish)
    taps: tuple[TapConfig, ...] = key(
        "Each tap: what it records, where, through which filters.", ()
    )
    worker: WorkerOptions = key("The tap worker's bounds and budgets.", factory=WorkerOptions)
    #: The JetStream connection and stream; set when the file has a ``nats`` section.
    nats: NatsConfig | None = key(
        "The JetStream connection and stream (required when a tap uses transport: nats).",
        None,
    )
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


@attrs.define
class _Context:
    """What a key's parse and derived default may read (``values.Context``)."""

    reader: _SchemaReader
    publish: Publish = attrs.field(factory=Publish)
    index: int = 0

    def local_path(self, value: str) -> Path:
        return self.reader.local_path(value)

    def tokenizer(self, value: str) -> str:
        """A local directory, relative to the file's directory, or a hub id
        (``name`` or ``org/name``, looked up in the local cache by the worker).
        A value shaped like a path (``./``, ``../``, ``/``, ``~``, or more than
        one ``/``) is always a path. The worker reports a missing directory,
        with this key's line (``Config.where``)."""
        path = self.local_path(value)
        hub_id = not value.startswith((".", "/", "~")) and value.count("/") <= 1
        return value if hub_id and not path.exists() else str(path)


class _SchemaReader(Reader):
    """Reads the sections by their keys, and the lists item by item."""

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
        self.known(root, "", {f.name for f in keys(Config)})
        version = root.get("schema_version", MISSING)
        if version is MISSING:
            self.fail(root, "schema_version", "is required and must be 1")
        if version != 1 or isinstance(version, bool):
            self.fail(root, "schema_version", "must be 1", version)
        self.note(root, "schema_version", "schema_version")
        context = _Context(self)
        publish = self.read_section(Publish, root, "publish", context)
        context.publish = publish
        models = self.models(root, context)
        taps = self.taps(root, context, models)
        config = self.read(
            Config,
            root,
            "",
            context,
            path=self.path,
            schema_version=1,
            publish=publish,
            models=models,
            taps=taps,
            nats=None,
            lines=self.lines,
        )
        return attrs.evolve(config, nats=parse_nats_section(self, root, taps))

    def read_section(self, cls: type, root: Mapping, name: str, context: _Context) -> Any:
        section = self.section(root, name, "", {f.name for f in keys(cls)})
        return self.read(cls, section, f"{name}.", context)

    def models(self, root: Mapping, context: _Context) -> tuple[ModelEntry, ...]:
        items = self.get(root, "models", "", (list, type(None)), None) or []
        seen: set[str] = set()
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                expected = "must be a mapping with 'name' and 'tokenizer'"
                self.fail(root, f"models[{i}]", expected, item)
            model = self.read(ModelEntry, item, f"models[{i}].", context)
            if model.name in seen:
                self.fail(item, f"models[{i}].name", "must be unique across models", model.name)
            seen.add(model.name)
            out.append(model)
        return tuple(out)

    def taps(
        self, root: Mapping, context: _Context, models: tuple[ModelEntry, ...]
    ) -> tuple[TapConfig, ...]:
        items = self.get(root, "taps", "", (list, type(None)), None) or []
        taps: list[TapConfig] = []
        model_names = tuple(m.name for m in models)
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                self.fail(root, f"taps[{index}]", "must be a mapping", item)
            taps.append(self.tap(item, index, context, model_names))
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
                if b.topic.startswith(a.topic) and a.transport is b.transport is Transport.ZMQ:
                    expected = (
                        f"must not be a prefix of tap '{b.name}'s topic '{b.topic}' "
                        "(ZeroMQ subscriptions match by prefix)"
                    )
                    self.fail(item, f"taps[{a.name}].topic", expected, a.topic)
        return tuple(taps)

    def tap(
        self, item: Mapping, index: int, context: _Context, model_names: tuple[str, ...]
    ) -> TapConfig:
        raw_name = item.get("name")
        label = raw_name if isinstance(raw_name, str) and raw_name else str(index)
        prefix = f"taps[{label}]."
        if getattr(item, "line", 0):
            self.lines[f"taps[{label}]"] = item.line  # type: ignore[attr-defined]
        context.index = index
        tap = self.read(TapConfig, item, prefix, context)
        for model in tap.models:
            if model not in model_names:
                configured = ", ".join(model_names) if model_names else "none"
                expected = (
                    f"must name configured models (models: {configured}); "
                    f"'{model}' is not one, so the tap would never mirror it"
                )
                self.fail(item, f"{prefix}models", expected, list(tap.models))
        return tap
