"""The live replay's figures: Prometheus metrics, health, and the HTTP app
that serves them (``/metrics``, ``/healthz``).

``LiveObserver`` is the replay's ``window.PairObserver``: ``pair`` runs once
per replayed request as it finishes (counters and histograms at once, the pair
into the rolling window), ``skipped`` once per record not sent. ``publish``
sets the window gauges from a ``window.Snapshot`` (the service refreshes it at
least every 5 s). Every label value comes from a fixed vocabulary: targets
(candidate, baseline), outcomes (``OUTCOMES``), skip reasons (the replay's own
and the gate's), metric and stat names; never from a record.

``/healthz`` answers 200 while the service reads and its window is refreshed,
with a JSON body that says how each target is doing (``up``, or ``failing``
after ``FAILING_AFTER`` failed requests in a row, and since when); 503 when
the reading stopped or the window has not been refreshed for three refresh
periods. A failing candidate is not a reason to restart the replayer (it
resumes on its own once the candidate answers), so it is said in the body,
not by the status.
"""

from __future__ import annotations

import math
import time
from typing import Any

import attrs
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from shadow_proxy.metrics import LATENCY_BUCKETS
from shadow_proxy.replay.compare import Difference, Observation
from shadow_proxy.replay.request import CandidateRequest
from shadow_proxy.replay.window import Pair, Snapshot, Window, empty_snapshot, greedy

#: ``shadow_replay_requests_total{outcome}``.
OUTCOMES = ("ok", "error", "timeout", "cancelled")
TARGETS = ("candidate", "baseline")
LATENCIES = ("ttft", "itl", "e2e")
STATS = ("p50", "low", "high")
#: Failed requests in a row after which /healthz calls a target failing.
FAILING_AFTER = 5
#: The window is refreshed this often (seconds): the issue's "at least every 5 s".
REFRESH_S = 5.0


def outcome_of(observation: Observation) -> str:
    """The ``outcome`` label of one answer."""
    if observation.outcome == "cancelled":
        return "cancelled"
    if observation.outcome == "error":
        return "timeout" if observation.error_kind == "timeout" else "error"
    return "ok"


class LiveMetrics:
    """The service's metrics, on the registry it is given (named as issue 30 fixes them)."""

    def __init__(self, registry: CollectorRegistry, targets: tuple[str, ...]) -> None:
        self.registry = registry
        self.targets = targets
        self.requests = Counter(
            "shadow_replay_requests",
            "Replayed requests by target and outcome.",
            ["target", "outcome"],
            registry=registry,
        )
        self.skipped = Counter(
            "shadow_replay_skipped",
            "Records not replayed, by reason.",
            ["reason"],
            registry=registry,
        )
        self.latency = {
            name: Histogram(
                f"shadow_replay_{name}_seconds",
                f"{name.upper()} of successful replayed requests, by target.",
                ["target"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
            for name in LATENCIES
        }
        self.ratio = Gauge(
            "shadow_replay_ratio",
            "Window p50 ratio candidate/reference (stat p50) and its 95% interval (low, high).",
            ["metric", "stat"],
            registry=registry,
        )
        self.verdict = Gauge(
            "shadow_replay_verdict",
            "Window verdict: 1 candidate worse, 0 no difference beyond noise, -1 better; "
            "NaN until the window holds enough pairs.",
            ["metric"],
            registry=registry,
        )
        self.exact_match = Gauge(
            "shadow_replay_exact_match_ratio",
            "Window share of greedy records whose output equals the primary's.",
            ["target"],
            registry=registry,
        )
        self.pairs = Gauge(
            "shadow_replay_window_pairs", "Pairs in the current window.", registry=registry
        )
        self.judge_crashes = Counter(
            "shadow_replay_judge_crashes",
            "Times the judge process (the window's bootstrap) died or hung; it is started again.",
            registry=registry,
        )
        for target in targets:  # every series exists from the start (a rate reads 0, not absent)
            for outcome in OUTCOMES:
                self.requests.labels(target, outcome)
        for reason in ("sampled_out", "rate_limited", "queue_full", "late"):
            self.skipped.labels(reason)
        self.publish(empty_snapshot("baseline" in targets))

    def observe(self, target: str, observation: Observation) -> None:
        self.requests.labels(target, outcome_of(observation)).inc()
        if not observation.succeeded:
            return
        for name in LATENCIES:
            value = getattr(observation, f"{name}_ms")
            if value is not None:
                self.latency[name].labels(target).observe(value / 1000)

    def publish(self, snapshot: Snapshot) -> None:
        """Set the window gauges from ``snapshot``."""
        for metric, values in snapshot.ratios.items():
            for stat, value in zip(STATS, values, strict=True):
                self.ratio.labels(metric, stat).set(value)
        for metric, value in snapshot.verdicts.items():
            self.verdict.labels(metric).set(value)
        for target, value in snapshot.exact_match.items():
            self.exact_match.labels(target).set(value)
        self.pairs.set(snapshot.pairs)


@attrs.define
class TargetHealth:
    """One target's recent answers, for /healthz."""

    failures_in_row: int = 0
    last_ok_ns: int | None = None
    last_error: str | None = None

    def observe(self, observation: Observation, now_ns: int) -> None:
        if observation.succeeded:
            self.failures_in_row, self.last_ok_ns = 0, now_ns
        else:
            self.failures_in_row += 1
            self.last_error = observation.error_key

    def to_json(self, now_ns: int) -> dict[str, Any]:
        since = None if self.last_ok_ns is None else round((now_ns - self.last_ok_ns) / 1e9, 1)
        return {
            "state": "failing" if self.failures_in_row >= FAILING_AFTER else "up",
            "failures_in_row": self.failures_in_row,
            "last_error": self.last_error,
            "last_ok_s_ago": since,
        }


class LiveObserver:
    """What the service keeps of every record: metrics, window, health."""

    def __init__(self, window: Window, metrics: LiveMetrics) -> None:
        self.window = window
        self.metrics = metrics
        self.health = {t: TargetHealth() for t in metrics.targets}
        self.reading = True
        self.refreshed_ns = time.monotonic_ns()
        self.snapshot = empty_snapshot(window.has_baseline)

    def pair(
        self,
        request: CandidateRequest,
        primary: Observation | None,
        candidate: Observation,
        diff: Difference | None,
        baseline: Observation | None,
        baseline_diff: Difference | None,
    ) -> None:
        now = time.monotonic_ns()
        for target, seen in (("candidate", candidate), ("baseline", baseline)):
            if seen is not None:
                self.metrics.observe(target, seen)
                self.health[target].observe(seen, now)
        self.window.add(
            Pair(now, primary, candidate, diff, baseline, baseline_diff, greedy(request.body))
        )

    def skipped(self, reason: str) -> None:
        self.metrics.skipped.labels(reason).inc()

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.metrics.publish(snapshot)
        self.refreshed_ns = time.monotonic_ns()

    def health_json(self) -> tuple[int, dict[str, Any]]:
        """/healthz's status and body."""
        now = time.monotonic_ns()
        age = (now - self.refreshed_ns) / 1e9
        healthy = self.reading and age < 3 * REFRESH_S
        targets = {t: h.to_json(now) for t, h in self.health.items()}
        failing = any(t["state"] == "failing" for t in targets.values())
        verdicts = {k: None if math.isnan(v) else v for k, v in self.snapshot.verdicts.items()}
        body = {
            "status": "ok" if healthy and not failing else "degraded" if healthy else "stopped",
            "reading": self.reading,
            "refreshed_s_ago": round(age, 1),
            "window_pairs": self.snapshot.pairs,
            "verdicts": verdicts,
            "targets": targets,
        }
        return (200 if healthy else 503), body


OBSERVER = web.AppKey("observer", LiveObserver)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[OBSERVER].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    status, body = request.app[OBSERVER].health_json()
    return web.json_response(body, status=status)


def make_app(observer: LiveObserver) -> web.Application:
    """The metrics app: ``/metrics`` (Prometheus text) and ``/healthz`` (JSON)."""
    app = web.Application()
    app[OBSERVER] = observer
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app
