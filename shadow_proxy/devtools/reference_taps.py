"""The reference deployment's two taps, and proxy configurations built around them.

The reference deployment (``deploy/kubernetes/base/configmap.yaml``, and
``config/example.yaml`` for a single machine) runs two taps:

- ``kv-history-tracker``: ``capture: request``, ``tokens-only``: the prompt's
  token ids, stop and sampling options as soon as the request is preprocessed,
  for KV-cache and router studies;
- ``shadow-replay``: ``capture: request_response``, ``emit: joined``,
  ``strip-multimodal``: one record per request with its response's output token
  ids when the response ends, for shadow replay and output comparison.

The demo, the benchmarks and the tests build their configurations here, and a
unit test checks these taps against both files, so none of them can drift.
Everything returned is a fresh plain mapping (for ``Config.from_mapping`` or a
YAML file); callers may change it freely.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from shadow_proxy.config.docs import EXAMPLE_LISTS

#: The two taps as the deployment names them (no endpoint: the deployment
#: binds ``publish.base_port + index``; local runs pass their own endpoints):
#: the example file's, written from ``config/docs.py``.
REFERENCE_TAPS: tuple[Mapping[str, Any], ...] = tuple(EXAMPLE_LISTS["taps"])
TAP_NAMES = tuple(tap["name"] for tap in REFERENCE_TAPS)
#: The tap whose records join the request with its response.
JOINED_TAP = "shadow-replay"
#: The tap whose records hold the request only.
REQUEST_TAP = "kv-history-tracker"


def reference_taps(endpoints: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The two reference taps; with ``endpoints`` (one per tap, in order), each
    binds its own (e.g. ``processes.reserve_endpoint()``)."""
    taps = [copy.deepcopy(dict(tap)) for tap in REFERENCE_TAPS]
    if endpoints is not None:
        if len(endpoints) != len(taps):
            msg = f"'endpoints' must name one endpoint per tap ({len(taps)}; got {len(endpoints)})"
            raise ValueError(msg)
        for tap, endpoint in zip(taps, endpoints, strict=True):
            tap["endpoint"] = endpoint
    return taps


def proxy_config(
    upstream_url: str,
    /,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    models: Mapping[str, str | Path] | Sequence[Mapping[str, Any]] | None = None,
    taps: Sequence[Mapping[str, Any]] = (),
    **overrides: Any,
) -> dict[str, Any]:
    """A proxy configuration (schema version 1) as a plain mapping.

    It forwards to ``upstream_url`` and listens on ``host:port`` (0: any free port,
    for a proxy run in-process); ``models`` maps served names to tokenizer
    directories (or is a list of model entries as the file holds them);
    ``taps`` are tap mappings (``reference_taps()``, or a test's
    own). ``overrides`` are further top-level keys; a mapping given for a key
    the configuration already holds (``listen``, ``upstream``) updates it.
    """
    mapping: dict[str, Any] = {
        "schema_version": 1,
        "listen": {"host": host, "port": port},
        "upstream": {"url": upstream_url},
    }
    if isinstance(models, Mapping):
        mapping["models"] = [{"name": n, "tokenizer": str(path)} for n, path in models.items()]
    elif models:
        mapping["models"] = [dict(entry) for entry in models]
    if taps:
        mapping["taps"] = [copy.deepcopy(dict(tap)) for tap in taps]
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(mapping.get(key), dict):
            mapping[key] = {**mapping[key], **value}
        else:
            mapping[key] = value
    return mapping


def write_config(path: Path, mapping: Mapping[str, Any]) -> Path:
    """Write ``mapping`` as a YAML configuration file; returns ``path``."""
    path.write_text(yaml.safe_dump(dict(mapping), sort_keys=False), encoding="utf-8")
    return path
