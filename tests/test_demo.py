"""The demo: the three reference runs on real processes, and its accounting rules."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools import demo

TAPS = ("kv-history-tracker", "shadow-replay")


@pytest.fixture(scope="module")
def reference(model_dirs: dict[str, Path], tmp_path_factory) -> dict[str, Any]:
    """The three reference runs, once for the module: results by title, and the
    printed tables."""
    path = tmp_path_factory.mktemp("demo") / "demo.json"
    out = io.StringIO()
    status = demo.run_demo(
        ["--runs", "reference", "--tokenizer", str(model_dirs["deepseek"]), "--json", str(path)],
        out=out,
    )
    document = json.loads(path.read_text(encoding="utf-8"))
    runs = {run["title"]: run for run in document["runs"]}
    return {"status": status, "runs": runs, "document": document, "text": out.getvalue()}


def _run(reference: dict[str, Any], title: str) -> dict[str, Any]:
    run = reference["runs"][title]
    assert run["ok"], f"{run['failures']}\n{reference['text']}"
    return run


def _assert_every_record(run: dict[str, Any]) -> None:
    clients = run["clients"]
    assert clients["requests"] == 200
    assert clients["errors"] == 0
    for name in TAPS:
        tap = run["taps"][name]
        assert tap["records"] == 200, name
        assert tap["prompt_tokens"] == clients["frontend_prompt_tokens"], name
        assert tap["tap_gaps"] == tap["transport_gaps"] == 0, name
        assert tap["tail_loss"] == tap["transport_tail_loss"] == 0, name
        assert tap["duplicates"] == 0, name
    assert run["proxy"]["prompt_token_mismatches"] == 0
    assert set(run["exit_status"]) == {"proxy", *(f"consumer-{n}" for n in TAPS)}
    assert all(status == 0 for status in run["exit_status"].values())


@pytest.mark.slow
@pytest.mark.timeout(300)
class TestReferenceRuns:
    """200 requests, ISL 512, OSL 32: each tap holds a record per request, no gap,
    and as many prompt tokens as the frontend reports."""

    def test_demo_passes(self, reference):
        assert reference["status"] == 0, reference["text"]
        assert reference["document"]["ok"] is True
        assert len(reference["runs"]) == 3
        assert "3/3 runs OK" in reference["text"]

    def test_streaming(self, reference):
        run = _run(reference, "streaming")
        assert run["load"]["stream"] is True
        _assert_every_record(run)
        clients = run["clients"]
        assert clients["ok"] == 200
        # Every answer carried usage: the frontend's total is the clients' sum.
        assert clients["frontend_prompt_tokens"] == clients["prompt_tokens"] > 200 * 400
        assert run["taps"]["shadow-replay"]["outcomes"] == {"complete": 200}
        assert run["taps"]["shadow-replay"]["output_tokens"] == clients["completion_tokens"]
        assert run["proxy"]["prompt_token_checks"] == 200

    def test_non_streaming(self, reference):
        run = _run(reference, "non-streaming")
        assert run["load"]["stream"] is False
        _assert_every_record(run)
        clients = run["clients"]
        assert clients["ok"] == 200
        assert clients["frontend_prompt_tokens"] == clients["prompt_tokens"]
        assert run["taps"]["shadow-replay"]["outcomes"] == {"complete": 200}
        assert run["taps"]["shadow-replay"]["output_tokens"] == clients["completion_tokens"]

    def test_cancelled_by_the_client(self, reference):
        run = _run(reference, "streaming, 25% cancelled")
        assert run["load"]["cancel_fraction"] == 0.25
        _assert_every_record(run)
        clients = run["clients"]
        assert 40 <= clients["cancelled"] <= 60
        assert clients["ok"] + clients["cancelled"] == 200
        assert run["taps"]["shadow-replay"]["outcomes"] == {
            "cancelled": clients["cancelled"],
            "complete": clients["ok"],
        }
        # The cancelled requests' prompts were counted by asking the frontend again.
        assert clients["prompt_tokens_asked_again"] == clients["cancelled"]
        assert clients["frontend_prompt_tokens"] > clients["prompt_tokens"]
        assert run["proxy"]["client_disconnects"] == clients["cancelled"]

    def test_the_table(self, reference):
        text = reference["text"]
        for heading in ("clients", "proxy /metrics", "taps (consumer totals)"):
            assert f"\n{heading}\n" in text
        assert text.count("\nOK: each tap holds 200 records") == 3
        assert "kv-history-tracker      200" in text


# --------------------------------------------------------------------------- the rules


def _good_result() -> dict[str, Any]:
    taps = {
        "kv-history-tracker": {
            "records": 10, "prompt_tokens": 500, "output_tokens": 0, "outcomes": {},
            "tap_gaps": 0, "transport_gaps": 0, "tail_loss": 0, "transport_tail_loss": 0,
            "duplicates": 0, "undecodable": {},
        },
        "shadow-replay": {
            "records": 10, "prompt_tokens": 500, "output_tokens": 80,
            "outcomes": {"complete": 8, "cancelled": 2},
            "tap_gaps": 0, "transport_gaps": 0, "tail_loss": 0, "transport_tail_loss": 0,
            "duplicates": 0, "undecodable": {},
        },
    }  # fmt: skip
    return {
        "clients": {
            "requests": 10,
            "ok": 8,
            "cancelled": 2,
            "errors": 0,
            "frontend_prompt_tokens": 500,
            "prompt_tokens_uncounted": 0,
        },
        "taps": taps,
        "proxy": {
            "taps": {name: {"queued": 10, "published": 10} for name in taps},
            "prompt_token_mismatches": 0,
            "handoff_dropped": {},
        },
        "exit_status": {"proxy": 0, "consumer-kv-history-tracker": 0},
    }


class TestEvaluate:
    """The run fails, saying why, when any part of the accounting does not hold."""

    def test_a_good_run_passes(self):
        assert demo.evaluate(_good_result()) == []

    @pytest.mark.parametrize(
        ("path", "value", "expected"),
        [
            (("taps", "kv-history-tracker", "records"), 9, "9 records for 10 requests"),
            (("taps", "shadow-replay", "tap_gaps"), 1, "tap_gaps = 1"),
            (("taps", "shadow-replay", "transport_gaps"), 2, "transport_gaps = 2"),
            (("taps", "kv-history-tracker", "tail_loss"), 1, "tail_loss = 1"),
            (("taps", "shadow-replay", "prompt_tokens"), 499, "the frontend reports 500"),
            (("clients", "errors"), 1, "1 client requests failed"),
            (("proxy", "prompt_token_mismatches"), 3, "3 prompt mismatches"),
            (("exit_status", "proxy"), -9, "proxy exited with status -9"),
            (
                ("taps", "shadow-replay", "outcomes"),
                {"complete": 8, "error": 2},
                "0 cancelled records, the clients saw 2",
            ),
            (
                ("proxy", "taps", "shadow-replay", "dropped"),
                {"full": 1},
                "the proxy dropped records full 1",
            ),
        ],
    )
    def test_a_broken_rule_fails(self, path, value, expected):
        result = copy.deepcopy(_good_result())
        target = result
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        failures = demo.evaluate(result)
        assert any(expected in f for f in failures), failures


class TestPlan:
    """Without load options the demo runs the three reference runs; with one, a single run."""

    def test_default_is_the_reference_runs(self):
        runs = demo.plan(demo.build_parser().parse_args([]))
        assert [(r.stream, r.cancel_fraction) for r in runs] == [
            (True, 0.0),
            (False, 0.0),
            (True, 0.25),
        ]
        assert all((r.requests, r.isl, r.osl) == (200, 512, 32) for r in runs)

    def test_a_load_option_means_a_single_run(self):
        runs = demo.plan(demo.build_parser().parse_args(["--no-stream", "--requests", "5"]))
        assert [(r.stream, r.cancel_fraction, r.requests) for r in runs] == [(False, 0.0, 5)]
        runs = demo.plan(demo.build_parser().parse_args(["--cancel-fraction", "0.5"]))
        assert [(r.stream, r.cancel_fraction) for r in runs] == [(True, 0.5)]


class TestProxyMetrics:
    """The demo reads the proxy's Prometheus text into plain totals."""

    def test_parse(self):
        text = "\n".join(
            [
                "# TYPE shadow_proxy_requests counter",
                'shadow_proxy_requests_total{route="chat",status_class="2xx"} 7.0',
                'shadow_proxy_requests_total{route="chat",status_class="4xx"} 3.0',
                "# TYPE shadow_tap_queued counter",
                'shadow_tap_queued_total{tap="a"} 10.0',
                "# TYPE shadow_tap_published counter",
                'shadow_tap_published_total{tap="a"} 9.0',
                "# TYPE shadow_tap_dropped counter",
                'shadow_tap_dropped_total{reason="full",tap="a"} 1.0',
                "# TYPE shadow_prompt_token_mismatches counter",
                'shadow_prompt_token_mismatches_total{model="m"} 2.0',
                "",
            ]
        )
        metrics = demo.proxy_metrics(text)
        assert metrics["requests"] == {"chat 2xx": 7, "chat 4xx": 3}
        assert metrics["taps"] == {"a": {"queued": 10, "published": 9, "dropped": {"full": 1}}}
        assert metrics["prompt_token_mismatches"] == 2
        assert metrics["not_mirrored"] == {}
