"""The configuration file: strict YAML into frozen values (SPEC section 2).

``values.py`` and ``nats.py`` define each key once (an attrs field: name, type,
default, check, doc; ``keys.py``), ``reader.py`` reads a value class by its keys
strictly (lines, types, checks), ``schema.py`` holds ``Config.from_yaml`` and what
spans keys, ``docs.py`` writes the keys' table and the example file from them.
"""

from shadow_proxy.config.choices import (
    Capture,
    Emit,
    Priority,
    SampleBy,
    TemplateEngine,
    Transport,
)
from shadow_proxy.config.nats import GIB, Discard, NatsConfig
from shadow_proxy.config.reader import ConfigError
from shadow_proxy.config.schema import Config
from shadow_proxy.config.values import (
    MIB,
    CurveKeys,
    Listen,
    ModelEntry,
    Publish,
    ResponseOptions,
    TapConfig,
    Upstream,
    WorkerOptions,
)

__all__ = [
    "GIB",
    "MIB",
    "Capture",
    "Config",
    "ConfigError",
    "CurveKeys",
    "Discard",
    "Emit",
    "Listen",
    "ModelEntry",
    "NatsConfig",
    "Priority",
    "Publish",
    "ResponseOptions",
    "SampleBy",
    "TapConfig",
    "TemplateEngine",
    "Transport",
    "Upstream",
    "WorkerOptions",
]
