"""The demo on real processes: the four reference runs, the multi-turn run and the
replay run of ``make demo`` (ZeroMQ), and the reference runs through JetStream.

The numbers the demo prints are checked here against what can be computed
without the tools that produced them: the replay's exact-match rate from the
candidate's divergence rule over the recorded request ids, the multi-turn run's
infinite-cache hit rate by a brute-force longest-common-prefix count over the
recorded token ids."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shadow_proxy.devtools import demo
from shadow_proxy.devtools.frontend.config import diverges
from shadow_proxy.devtools.loadgen import LoadSpec
from shadow_proxy.records.files import read_payloads
from shadow_proxy.records.wire import decode_envelope

TAPS = ("kv-history-tracker", "shadow-replay")
REFERENCE = (
    "streaming",
    "non-streaming",
    "streaming, 25% cancelled",
    "responses, streaming, 25% cancelled",
)
MULTI_TURN = "multi-turn, 20 conversations x 8 turns"
# The demo's checks count the clients' cancels against the records exactly: which
# of a cancel and an answer's end comes first is the host's timing (solo: alone).
pytestmark = pytest.mark.solo

CANCELLED = sum(map(LoadSpec(url="", model="m", cancel_fraction=0.25).cancels, range(200)))


def _run_demo(argv: list[str], out_dir: Path) -> dict[str, Any]:
    path = out_dir / "demo.json"
    out = io.StringIO()
    status = demo.run_demo([*argv, "--out", str(out_dir), "--json", str(path)], out=out)
    document = json.loads(path.read_text(encoding="utf-8"))
    runs = {run["title"]: run for run in document["runs"]}
    return {"status": status, "runs": runs, "document": document, "text": out.getvalue()}


@pytest.fixture(scope="module")
def everything(model_dirs: dict[str, Path], tmp_path_factory) -> dict[str, Any]:
    """``make demo`` as it runs (every run), once for the module."""
    out_dir = tmp_path_factory.mktemp("demo")
    return _run_demo(["--tokenizer", str(model_dirs["deepseek"])], out_dir)


@pytest.fixture(scope="module")
def over_nats(model_dirs: dict[str, Path], tmp_path_factory) -> dict[str, Any]:
    """``--transport nats --runs reference``, once for the module."""
    out_dir = tmp_path_factory.mktemp("demo-nats")
    argv = [
        "--runs",
        "reference",
        "--transport",
        "nats",
        "--tokenizer",
        str(model_dirs["deepseek"]),
    ]
    return _run_demo(argv, out_dir)


def _run(reference: dict[str, Any], title: str) -> dict[str, Any]:
    run = reference["runs"][title]
    assert run["ok"], f"{run['failures']}\n{reference['text']}"
    return run


def _assert_every_record(run: dict[str, Any], requests: int = 200) -> None:
    clients = run["clients"]
    assert clients["requests"] == requests
    assert clients["errors"] == 0
    for name in TAPS:
        tap = run["taps"][name]
        assert tap["records"] == requests, name
        assert tap["prompt_tokens"] == clients["frontend_prompt_tokens"], name
        assert tap["tap_gaps"] == tap["transport_gaps"] == 0, name
        assert tap["tail_loss"] == tap["transport_tail_loss"] == 0, name
        assert tap["duplicates"] == 0, name
    assert run["proxy"]["prompt_token_mismatches"] == 0
    assert set(run["exit_status"]) >= {"proxy", *(f"consumer-{n}" for n in TAPS)}
    assert all(status == 0 for status in run["exit_status"].values())


def settled(outcomes: dict[str, int]) -> dict[str, int]:
    """Outcomes as two runs of the same requests must agree on them: a client that
    cancels races its stream's end, so one run's ``cancelled`` may be the other's
    ``complete`` (each run's records agree with its own clients: _assert_every_record);
    every other outcome, and the sum of those two, is the same in both."""
    merged = {k: v for k, v in outcomes.items() if k not in ("complete", "cancelled")}
    merged["complete or cancelled"] = outcomes.get("complete", 0) + outcomes.get("cancelled", 0)
    return merged


def _envelopes(path: str | Path) -> list[dict[str, Any]]:
    return [decode_envelope(p) for p in read_payloads(Path(path))]


@pytest.mark.slow
@pytest.mark.timeout(400)
class TestEveryRun:
    """``make demo``: 200 requests per reference run (ISL 512, OSL 32), 20 x 8
    multi-turn, the replay of run 1; each holds its accounting."""

    def test_demo_passes(self, everything):
        assert everything["status"] == 0, everything["text"]
        document = everything["document"]
        assert document["ok"] is True and document["transport"] == "zmq"
        assert list(everything["runs"]) == [*REFERENCE, MULTI_TURN, "replay"]
        assert document["services"] == {"frontend": 0}
        assert "6/6 runs OK" in everything["text"]
        assert f"records and reports: {document['out']}" in everything["text"]

    def test_streaming(self, everything):
        run = _run(everything, "streaming")
        assert (run["load"]["stream"], run["load"]["api"]) == (True, "chat")
        _assert_every_record(run)
        clients = run["clients"]
        assert clients["ok"] == 200
        # Every answer carried usage: the frontend's total is the clients' sum.
        assert clients["frontend_prompt_tokens"] == clients["prompt_tokens"] > 200 * 400
        assert run["taps"]["shadow-replay"]["outcomes"] == {"complete": 200}
        assert run["taps"]["shadow-replay"]["output_tokens"] == clients["completion_tokens"]
        assert run["proxy"]["prompt_token_checks"] == 200
        # The consumers kept the records in --out.
        assert len(_envelopes(run["records"]["shadow-replay"])) == 200

    def test_non_streaming(self, everything):
        run = _run(everything, "non-streaming")
        assert run["load"]["stream"] is False
        _assert_every_record(run)
        clients = run["clients"]
        assert clients["ok"] == 200
        assert clients["frontend_prompt_tokens"] == clients["prompt_tokens"]
        assert run["taps"]["shadow-replay"]["outcomes"] == {"complete": 200}
        assert run["taps"]["shadow-replay"]["output_tokens"] == clients["completion_tokens"]

    @pytest.mark.parametrize(
        ("title", "route"),
        [
            ("streaming, 25% cancelled", "chat"),
            ("responses, streaming, 25% cancelled", "responses"),
        ],
    )
    def test_cancelled_by_the_client(self, everything, title: str, route: str):
        run = _run(everything, title)
        assert (run["load"]["cancel_fraction"], run["load"]["api"]) == (0.25, route)
        _assert_every_record(run)
        clients = run["clients"]
        assert clients["cancelled"] == CANCELLED and 40 <= CANCELLED <= 60
        assert clients["ok"] + clients["cancelled"] == 200
        assert run["taps"]["shadow-replay"]["outcomes"] == {
            "cancelled": clients["cancelled"],
            "complete": clients["ok"],
        }
        # The cancelled requests' prompts were counted by asking the frontend again.
        assert clients["prompt_tokens_asked_again"] == clients["cancelled"]
        assert clients["frontend_prompt_tokens"] > clients["prompt_tokens"]
        assert run["proxy"]["client_disconnects"] == clients["cancelled"]
        assert run["proxy"]["requests"][f"{route} 2xx"] == clients["ok"]
        assert run["proxy"]["prompt_token_checks"] == clients["ok"]

    def test_responses_time_to_first_token(self, everything):
        """The Responses run's TTFT is its first token's, not ``response.created``'s
        (the built-in frontend waits 20 ms before the first token)."""
        run = _run(everything, "responses, streaming, 25% cancelled")
        assert run["clients"]["ttft_p50_ms"] >= 20

    def test_multi_turn(self, everything):
        run = _run(everything, MULTI_TURN)
        assert (run["load"]["conversations"], run["load"]["turns"]) == (20, 8)
        _assert_every_record(run, requests=160)
        assert run["taps"]["shadow-replay"]["outcomes"] == {"complete": 160}
        assert run["sessions"]["sessions"] == 20
        assert run["sessions"]["turns_per_session"] == [8]
        assert run["sessions"]["turns_not_extending"] == 0
        assert run["exit_status"]["shadow-trace"] == 0

    def test_each_turn_holds_the_previous_answer(self, everything):
        """Turn t's prompt is turn t-1's prompt, then the answer turn t-1 got (the
        joined record's output token ids: the built-in frontend's streamed text,
        tokenized again by the tap worker), then more."""
        run = _run(everything, MULTI_TURN)
        prompts = {
            r["request_id"]: r["request"]["token_ids"]
            for r in _envelopes(run["records"]["kv-history-tracker"])
        }
        answers = {
            r["request_id"]: r["response"]["choices"][0]["token_ids"]
            for r in _envelopes(run["records"]["shadow-replay"])
        }
        assert len(prompts) == len(answers) == 160
        for conversation in range(20):
            for turn in range(1, 8):
                before = prompts[f"conv-{conversation:02d}-turn-{turn - 1}"]
                answer = answers[f"conv-{conversation:02d}-turn-{turn - 1}"]
                now = prompts[f"conv-{conversation:02d}-turn-{turn}"]
                assert len(answer) >= 30
                assert now[: len(before)] == before
                assert now[len(before) : len(before) + len(answer)] == answer

    def test_reuse_equals_a_brute_force_count(self, everything):
        """The infinite cache's hit rate, by longest common prefixes in arrival order:
        a request hits B x max over earlier requests of floor(lcp / B) tokens."""
        run = _run(everything, MULTI_TURN)
        records = sorted(
            _envelopes(run["records"]["kv-history-tracker"]), key=lambda r: r["arrival_unix_ns"]
        )
        prompts = [np.asarray(r["request"]["token_ids"]) for r in records]
        total = sum(p.size for p in prompts)
        rows = {row["block_size"]: row for row in run["reuse"]["block_sizes"]}
        assert set(rows) == {16, 64}
        for block, row in rows.items():
            hits = 0
            for i, prompt in enumerate(prompts):
                best = 0
                for earlier in prompts[:i]:
                    n = min(earlier.size, prompt.size)
                    differ = np.flatnonzero(earlier[:n] != prompt[:n])
                    best = max(best, int(differ[0]) if differ.size else n)
                hits += best // block * block
            assert row["requests"] == 160 and row["prompt_tokens"] == total
            assert row["hit_rate_infinite"] == pytest.approx(hits / total, abs=1e-12)
            rates = [row["lru"][str(c)] for c in (4096, 8192, 16384, 32768)]
            assert rates == sorted(rates) and rates[-1] <= row["hit_rate_infinite"]
            # The shared system prompt stays cached in 4k tokens; the histories do not.
            assert 0.1 < rates[0] < 0.5 < row["hit_rate_infinite"]

    def test_replay(self, everything):
        run = _run(everything, "replay")
        source = everything["runs"]["streaming"]
        ids = [r["request_id"] for r in _envelopes(source["records"]["shadow-replay"])]
        diverging = sum(diverges(i, 0.2) for i in ids)
        assert 0 < diverging < 200
        summary = run["summary"]
        assert (summary["records"], summary["replayed"], summary["errors"]) == (200, 200, 0)
        assert summary["exact_match_rate"] == round((200 - diverging) / 200, 6)
        assert summary["first_divergence"] == {"p50": 4, "p90": 4, "p99": 4, "n": diverging}
        assert summary["differences"]["output"] == {
            "differs": diverging,
            "noise": 0,
            "counted": diverging,
        }
        assert summary["ttft_ms"]["verdict"] == summary["itl_ms"]["verdict"] == "higher"
        # The candidate is 50 ms slower to its first token: about 70 ms against 20.
        assert summary["ttft_ms"]["candidate"]["p50"] - summary["ttft_ms"]["baseline"]["p50"] > 35
        assert run["exit_status"] == {"candidate": 0, "baseline": 0, "shadow-replay": 0}
        report = Path(run["report"])
        assert report.is_file() and (report.parent / "pairs.jsonl").read_text().count("\n") == 200

    def test_the_tables(self, everything):
        text = everything["text"]
        for heading in ("clients", "proxy /metrics", "taps (consumer totals)"):
            assert text.count(f"\n{heading}\n") == 5
        assert text.count("\nOK: each tap holds 200 records") == 4
        assert text.count("\nOK: each tap holds 160 records") == 1
        assert "kv-history-tracker      200" in text
        assert "\nKV-cache reuse of the kv-history-tracker records" in text
        assert "  sessions 20 x 8 turns" in text
        assert "\n== replay: the 200 shadow-replay records of run 1 (streaming)" in text
        assert "\nOK: every record replayed" in text


@pytest.mark.slow
@pytest.mark.nats
@pytest.mark.timeout(400)
class TestJetStream:
    """``--transport nats``: the reference runs through a local nats-server give the
    same totals as through ZeroMQ."""

    def test_passes(self, over_nats):
        assert over_nats["status"] == 0, over_nats["text"]
        assert over_nats["document"]["transport"] == "nats"
        assert over_nats["document"]["services"] == {"nats-server": 0, "frontend": 0}
        assert list(over_nats["runs"]) == list(REFERENCE)
        assert over_nats["text"].count("taps over NATS JetStream") == 4

    @pytest.mark.parametrize("title", REFERENCE)
    def test_same_totals_as_zeromq(self, over_nats, everything, title: str):
        nats_run, zmq_run = _run(over_nats, title), _run(everything, title)
        _assert_every_record(nats_run)
        number = REFERENCE.index(title) + 1
        for name in TAPS:
            tap = nats_run["taps"][name]
            assert tap["source"].startswith(
                f"stream DEMO_{number} subject shadow.{name} durable demo-{name} at nats://"
            )
            keys = ("records", "prompt_tokens")
            assert {k: tap[k] for k in keys} == {k: zmq_run["taps"][name][k] for k in keys}
            assert settled(tap["outcomes"]) == settled(zmq_run["taps"][name]["outcomes"])
