"""The demo's three reference runs on real processes."""

from __future__ import annotations

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
