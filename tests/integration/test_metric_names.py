"""Every metric name the docs, the dashboard and the alerts mention exists on a
live ``/metrics`` of a proxy with taps."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
import yaml

from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.processes import reserve_endpoint, wait_until
from tests.support import ROOT
from tests.support.servers import proxy_config, run_proxy, serve

# A metric name; not the package (`shadow_proxy/`, `shadow_proxy.cli`).
NAME = re.compile(r"\bshadow_[a-z_]+[a-z]\b(?![./])")
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def mentioned() -> dict[str, set[str]]:
    dashboard = json.loads((ROOT / "deploy/grafana/shadow-proxy-dashboard.json").read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    rules = yaml.safe_load((ROOT / "deploy/kubernetes/base/prometheusrule.yaml").read_text())
    alerts = [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    pages = ("README.md", "docs/metrics.md", "deploy/README.md")
    readme = "".join((ROOT / page).read_text() for page in pages)
    return {
        "README": set(NAME.findall(readme)),
        "dashboard": {n for e in exprs for n in NAME.findall(e)},
        "alerts": {n for e in alerts for n in NAME.findall(e)},
    }


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@pytest.fixture(scope="module")
def exported(model_dirs) -> set[str]:
    """Family names from a live /metrics (TYPE lines), after traffic reached the taps."""
    import asyncio

    async def scrape() -> str:
        async with serve(mock_app(MockConfig(models={"deepseek": model_dirs["deepseek"]}))) as fe:
            config = proxy_config(
                fe,
                models={"deepseek": model_dirs["deepseek"]},
                taps=[
                    {"name": "kv", "capture": "request", "endpoint": reserve_endpoint()},
                    {
                        "name": "replay",
                        "capture": "request_response",
                        "endpoint": reserve_endpoint(),
                    },
                ],
            )
            async with run_proxy(config) as (url, registry, _), aiohttp.ClientSession() as s:
                body = {
                    "model": "deepseek",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                published = {"tap": "replay"}
                await wait_until(
                    lambda: registry.get_sample_value("shadow_tap_published_total", published),
                    timeout=30,
                )
                async with s.get(url + "/metrics") as r:
                    return await r.text()

    text = asyncio.run(scrape())
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


@pytest.mark.parametrize("where", ["README", "dashboard", "alerts"])
def test_every_mentioned_metric_is_exported(exported, where):
    names = mentioned()[where]
    assert names, f"no metric names found in the {where}"
    missing = sorted(n for n in names if n not in exported and family(n) not in exported)
    assert not missing, f"{where} mentions metrics the proxy does not export: {missing}"
