"""``shadow-replay --score`` refuses the real Dynamo 1.6.1: it answers a
scoring request 200 and leaves ``prompt_logprobs`` out, so the tool says so in
one line and exits 2 before any record is sent (issue 27)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from shadow_proxy.replay.cli import EXIT_USAGE
from tests.support.dynamo import dynamo_with_mockers
from tests.support.replay import joined_record
from tests.support.trace_records import write_records

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(400)]


async def test_dynamo_is_refused(tmp_path: Path) -> None:
    record = joined_record(0, "ab", max_tokens=2)
    record["response"]["choices"][0]["token_ids"] = [10, 11]
    source = write_records(tmp_path / "joined.rec", [record])
    async with dynamo_with_mockers(tmp_path / "dynamo", speedup=10.0) as dynamo:
        argv = [
            str(source),
            "--candidate",
            dynamo.base_url,
            "--baseline",
            dynamo.base_url,
            "--score",
            "--out",
            str(tmp_path / "out"),
        ]
        tool = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shadow_proxy.replay.cli", *argv, stderr=asyncio.subprocess.PIPE
        )
        _, raw = await asyncio.wait_for(tool.communicate(), 120)
    code, err = tool.returncode, raw.decode()
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "does not return prompt log-probabilities" in lines[0], err
    assert "Dynamo 1.6.1 ignores prompt_logprobs" in lines[0]
    assert not (tmp_path / "out" / "pairs.jsonl").exists()  # nothing was replayed
