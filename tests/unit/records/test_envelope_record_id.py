"""A batch's prompt records: one id each for the project's readers (trace export, replay)."""

from __future__ import annotations

import json

from shadow_proxy.records.envelope import record_id
from shadow_proxy.replay.request import build_request
from shadow_proxy.trace.cli import main
from tests.support.trace_records import envelope, write_records


def prompt(seq: int, index: int, tokens: list[int]) -> dict:
    record = envelope(seq, tokens, output_tokens=2, request_id="batch-1")
    return {**record, "prompt_index": index}


class TestRecordId:
    """``request_id``, or ``{request_id}-{prompt_index}`` as Dynamo names a prompt."""

    def test_ids(self) -> None:
        assert record_id(envelope(0, [1], request_id="r")) == "r"
        assert record_id(prompt(0, 0, [1])) == "batch-1-0"
        assert record_id(prompt(1, 1, [2])) == "batch-1-1"

    def test_dynamo_trace_rows_are_unique(self, tmp_path) -> None:
        path = write_records(tmp_path / "r.bin", [prompt(0, 0, [1, 2]), prompt(1, 1, [3])])
        out = tmp_path / "trace.jsonl"
        assert main(["export", str(path), "--format", "dynamo", "-o", str(out)]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        ids = [row["event"]["request"]["request_id"] for row in rows]
        assert ids == ["batch-1-0", "batch-1-1"]

    def test_replay_sends_each_prompt_under_its_own_id(self) -> None:
        requests = [build_request(prompt(i, i, [i + 1])) for i in (0, 1)]
        assert [r.request_id for r in requests] == ["batch-1-0", "batch-1-1"]
        assert [r.body["prompt"] for r in requests] == [[1], [2]]
        sent = {
            r.headers_for(t)["x-request-id"] for r in requests for t in ("candidate", "baseline")
        }
        assert len(sent) == 4
