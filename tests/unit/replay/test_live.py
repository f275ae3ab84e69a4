"""The live metrics (named as issue 30 fixes them), /healthz and the observer."""

from __future__ import annotations

import math

import attrs
from prometheus_client import CollectorRegistry

from shadow_proxy.replay.compare import compare
from shadow_proxy.replay.live import (
    FAILING_AFTER,
    LiveMetrics,
    LiveObserver,
    make_app,
    outcome_of,
)
from shadow_proxy.replay.request import CandidateRequest
from shadow_proxy.replay.window import Window
from tests.support.replay import observation as obs


def observer(targets=("candidate", "baseline")) -> LiveObserver:
    has_baseline = "baseline" in targets
    window = Window(has_baseline=has_baseline, tolerance=0.05, min_diff_ms=1, max_error_rate=0.05)
    return LiveObserver(window, LiveMetrics(CollectorRegistry(), targets))


def request() -> CandidateRequest:
    return CandidateRequest(request_id="r", body={"model": "m", "temperature": 0}, prompt_tokens=3)


def feed(live: LiveObserver, candidate, baseline=None) -> None:
    p = obs(100.0)
    base_diff = None if baseline is None else compare(p, baseline, 5)
    live.pair(request(), p, candidate, compare(p, candidate, 5), baseline, base_diff)


class TestCounters:
    """Every request counted by target and outcome; latencies in seconds."""

    def test_outcomes_and_histograms(self) -> None:
        live = observer()
        feed(live, obs(250.0), obs(100.0))
        feed(live, obs(1.0, error="down"), obs(100.0))
        value = live.metrics.registry.get_sample_value
        assert value("shadow_replay_requests_total", {"target": "candidate", "outcome": "ok"}) == 1
        errors = {"target": "candidate", "outcome": "error"}
        assert value("shadow_replay_requests_total", errors) == 1
        assert value("shadow_replay_requests_total", {"target": "baseline", "outcome": "ok"}) == 2
        assert value("shadow_replay_ttft_seconds_sum", {"target": "candidate"}) == 0.25
        assert value("shadow_replay_e2e_seconds_count", {"target": "baseline"}) == 2
        live.skipped("rate_limited")
        assert value("shadow_replay_skipped_total", {"reason": "rate_limited"}) == 1
        assert value("shadow_replay_skipped_total", {"reason": "sampled_out"}) == 0

    def test_timeout_and_cancelled(self) -> None:
        timed_out = attrs.evolve(obs(1.0, error="no answer"), error_kind="timeout")
        assert outcome_of(timed_out) == "timeout"
        assert outcome_of(attrs.evolve(obs(1.0), outcome="cancelled")) == "cancelled"
        assert outcome_of(obs(1.0, error="down")) == "error"


class TestGauges:
    """The window gauges are NaN until a refresh with enough pairs."""

    def test_published(self) -> None:
        live = observer()
        value = live.metrics.registry.get_sample_value
        assert math.isnan(value("shadow_replay_verdict", {"metric": "ttft"}))
        for k in range(30):
            feed(live, obs(500.0 + k), obs(100.0 + k))
        live.publish(live.window.judge(live.window.pairs(live.refreshed_ns)))
        assert value("shadow_replay_verdict", {"metric": "ttft"}) == 1
        assert value("shadow_replay_window_pairs") == 30
        assert value("shadow_replay_ratio", {"metric": "ttft", "stat": "p50"}) > 4
        low = value("shadow_replay_ratio", {"metric": "ttft", "stat": "low"})
        assert 1 < low <= value("shadow_replay_ratio", {"metric": "ttft", "stat": "high"})
        assert value("shadow_replay_exact_match_ratio", {"target": "candidate"}) == 1


class TestHttp:
    """/metrics in Prometheus text, /healthz saying how each target does."""

    async def test_metrics_and_health(self, aiohttp_client) -> None:
        live = observer(("candidate",))
        client = await aiohttp_client(make_app(live))
        resp = await client.get("/metrics")
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
        assert 'shadow_replay_requests_total{outcome="ok",target="candidate"} 0.0' in text
        resp = await client.get("/healthz")
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
        for _ in range(FAILING_AFTER):
            feed(live, obs(1.0, error="down"))
        body = await (await client.get("/healthz")).json()
        assert body["status"] == "degraded"
        assert body["targets"]["candidate"]["state"] == "failing"
        assert body["targets"]["candidate"]["last_error"] == "503"
        feed(live, obs(100.0))
        body = await (await client.get("/healthz")).json()
        assert body["targets"]["candidate"]["state"] == "up"
        live.reading = False
        resp = await client.get("/healthz")
        assert resp.status == 503 and (await resp.json())["status"] == "stopped"
