"""The configuration file: strict YAML into frozen values (SPEC section 2).

``values.py`` holds the values, ``schema.py`` what a file may hold and
``Config.from_yaml``, ``reader.py`` the strict reading (lines, types, checks).
"""

from shadow_proxy.config.nats import GIB, Discard, NatsConfig
from shadow_proxy.config.reader import ConfigError
from shadow_proxy.config.schema import Config
from shadow_proxy.config.values import (
    MIB,
    Capture,
    CurveKeys,
    Emit,
    Listen,
    ModelEntry,
    Priority,
    Publish,
    ResponseOptions,
    SampleBy,
    TapConfig,
    TemplateEngine,
    Transport,
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
