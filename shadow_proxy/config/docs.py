"""The keys' table (docs/configuration.md) and the example file (config/example.yaml),
written from the keys' definitions (``keys.py``), so neither can drift from what the
reader reads: a unit test compares both files with what this writes.

    python -m shadow_proxy.config.docs      # rewrites both files from the definitions
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from shadow_proxy.config.keys import (
    is_list_of,
    is_section,
    keys,
    meta,
    optional,
    type_doc,
)
from shadow_proxy.config.nats import GIB, NatsConfig
from shadow_proxy.config.schema import Config
from shadow_proxy.config.values import MIB

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "example.yaml"
TABLE_PAGE = ROOT / "docs" / "configuration.md"
#: The generated table sits between these lines of the page.
BEGIN = "<!-- keys: written by python -m shadow_proxy.config.docs; do not edit by hand -->"
END = "<!-- end of keys -->"

#: The example deployment's lists: its model, and the reference taps (the demo, the
#: benchmarks and the tests use them through ``devtools/reference_taps.py``; the
#: Kubernetes ConfigMap's are checked against them).
EXAMPLE_LISTS: dict[str, list[dict[str, Any]]] = {
    "models": [{"name": "deepseek", "tokenizer": "../.models/deepseek"}],
    "taps": [
        {
            "name": "kv-history-tracker",
            "topic": "kv-history-tracker",
            "capture": "request",
            "filters": ["tokens-only"],
            "capacity": 4096,
        },
        {
            "name": "shadow-replay",
            "topic": "shadow-replay",
            "capture": "request_response",
            "emit": "joined",
            "filters": ["strip-multimodal"],
            "response": {"tokens": True, "chunk_timing": False},
            "capacity": 1024,
        },
    ],
}
HEADER = """\
# shadow-proxy: the reference deployment (two taps), every key shown with its default
# where it has one; optional keys without one are commented out. Validate with
# `shadow-proxy serve --config FILE` (exit 2 on error). The keys' table:
# docs/configuration.md. Written from the keys' definitions (shadow_proxy/config):
# python -m shadow_proxy.config.docs
"""
WIDTH = 88


def _scalar(value: Any) -> str:
    """A value as YAML writes it in flow style."""
    if isinstance(value, tuple):
        value = list(value)
    elif isinstance(value, str):
        value = str(value)  # an enum member as its plain string
    return yaml.safe_dump([value], default_flow_style=True, width=10_000).strip()[1:-1]


def _default(field: attrs.Attribute) -> str:
    """The default as the table says it."""
    rules = meta(field)
    if rules.default_doc is not None:
        return f"`{rules.default_doc}`"
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()  # type: ignore[union-attr]
    if hasattr(default, "names"):  # a FilterSet
        return "`[]`"
    if attrs.has(type(default)):
        return ""
    text = f"`{_scalar(default)}`"
    if isinstance(default, int) and not isinstance(default, bool) and default >= MIB:
        unit, size = ("GiB", GIB) if default % GIB == 0 else ("MiB", MIB)
        if default % size == 0:
            text += f" ({default // size} {unit})"
    return text


def _sections(cls: type, prefix: str) -> Iterator[tuple[str, attrs.Attribute]]:
    """Every key under ``cls``, depth first, as (dotted path, field)."""
    for field in keys(cls):
        path = f"{prefix}{field.name}"
        yield path, field
        inner, _ = optional(field.type)
        item = is_list_of(inner)
        if item is not None and is_section(item):
            yield from _sections(item, f"{path}[].")
        elif is_section(inner) and meta(field).yaml is None:
            yield from _sections(inner, f"{path}.")


def table() -> str:
    """The Markdown table of every key: its path, type, default and doc."""
    rows = ["| key | type | default | what |", "|---|---|---|---|"]
    for path, field in _sections(Config, ""):
        rules = meta(field)
        kind = "list of strings" if rules.yaml is list else type_doc(field.type)
        doc = rules.doc.replace("|", "\\|")
        rows.append(f"| `{path}` | {kind} | {_default(field)} | {doc} |")
    return "\n".join(rows) + "\n"


def _comment(doc: str, indent: str, wrap: bool = True) -> list[str]:
    width = WIDTH - len(indent) - 2
    lines = textwrap.wrap(doc, width, break_on_hyphens=False) if wrap else [doc]
    return [f"{indent}# {line}" for line in lines]


def _example_value(field: attrs.Attribute) -> Any:
    rules = meta(field)
    if rules.example is not None:
        return rules.example
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()  # type: ignore[union-attr]
    return None if default is attrs.NOTHING else default


def _mapping(
    cls: type, given: Mapping[str, Any], indent: str, *, all_active: bool, docs: bool = True
) -> list[str]:
    """``cls``'s keys at ``indent``: those in ``given`` (or, with ``all_active``,
    every key with a default or an example value) active, the others commented out."""
    out: list[str] = []
    for field in keys(cls):
        rules = meta(field)
        inner, _ = optional(field.type)
        name = field.name
        if docs:
            out += _comment(rules.doc, indent)
        if is_section(inner) and rules.yaml is None:
            value = given.get(name)
            if value is not None or (all_active and field.default is not None):
                out.append(f"{indent}{name}:")
                out += _mapping(inner, value or {}, indent + "  ", all_active=all_active, docs=docs)
            else:
                block = [f"{name}:", *_mapping(inner, {}, "  ", all_active=True, docs=False)]
                out += [f"{indent}# {line.replace('# ', '', 1)}" for line in block]
            continue
        if name in given:
            out.append(f"{indent}{name}: {_scalar(given[name])}")
            continue
        value = _example_value(field)
        shown = rules.default_doc if rules.default_doc is not None else _scalar(value)
        has_value = field.default is not attrs.NOTHING or rules.example is not None
        active = all_active and rules.derive is None and has_value
        out.append(f"{indent}{'' if active else '# '}{name}: {shown}")
    return out


def example() -> str:
    """config/example.yaml: every section with its defaults, the example's lists."""
    out = [HEADER.rstrip("\n"), "schema_version: 1", ""]
    for field in keys(Config):
        name = field.name
        if name == "schema_version":
            continue
        rules = meta(field)
        inner, _ = optional(field.type)
        item = is_list_of(inner)
        if item is not None:
            out += _comment(rules.doc, "")
            out.append(f"{name}:")
            for entry in EXAMPLE_LISTS[name]:
                lines = _mapping(item, entry, "    ", all_active=False)
                first = next(i for i, line in enumerate(lines) if not line.lstrip().startswith("#"))
                lines[first] = "  - " + lines[first][4:]
                out += lines
                out.append("")
        elif is_section(inner):
            out += _comment(rules.doc, "")
            if inner is NatsConfig:  # only when a tap uses transport: nats
                block = [f"{name}:", *_mapping(inner, {}, "  ", all_active=True, docs=False)]
                out += [f"# {line}" for line in block]
            else:
                out.append(f"{name}:")
                out += _mapping(inner, {}, "  ", all_active=True)
            out.append("")
        else:
            out += _comment(rules.doc, "")
            out.append(f"{name}: {_scalar(_example_value(field))}")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def page_with_table(page: str) -> str:
    """The docs page with its table replaced by the current one."""
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    EXAMPLE.write_text(example(), encoding="utf-8")
    TABLE_PAGE.write_text(page_with_table(TABLE_PAGE.read_text(encoding="utf-8")), "utf-8")
    print(f"wrote {EXAMPLE.relative_to(ROOT)} and the table of {TABLE_PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
