"""What the worker benchmarks read of a running proxy: its /metrics (counters,
histogram buckets), its /shadow/taps listing, the worker's processes."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from bench.procfs import children
from bench.services import get_text

HISTOGRAM = re.compile(r'^(\w+)_bucket\{(.*?)le="([^"]+)"(.*?)\} (\S+)$', re.M)


def metrics(url: str) -> str:
    return get_text(url + "/metrics")


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for family, before, le, after, value in HISTOGRAM.findall(text):
        if family == name and all(f'{k}="{v}"' in before + after for k, v in labels.items()):
            out[float(le)] = out.get(float(le), 0.0) + float(value)
    return out


def listing(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/shadow/taps", timeout=10) as r:
        return json.loads(r.read())["taps"]


def worker_pids(main: int) -> list[int]:
    return [main, *children(main)]
