"""The multi-turn run's sessions and reuse summary: from record files as the
consumers write them, through the real ``shadow-trace analyze``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.devtools.demo import multiturn
from tests.support.trace_records import envelope, write_records

SYSTEM = list(range(32))


def conversations() -> dict[str, list[list[int]]]:
    """Two sessions of two turns; lengths in whole 16-token blocks."""
    a0 = SYSTEM + list(range(100, 116))
    b0 = SYSTEM + list(range(200, 216))
    return {"conv-a": [a0, a0 + list(range(120, 136))], "conv-b": [b0, b0 + list(range(220, 236))]}


def records(
    sessions: dict[str, list[list[int]]], *, drop_session: str | None = None
) -> tuple[list[dict], list[dict]]:
    """(joined records with session ids, request records with token ids), turn
    after turn, the sessions interleaved."""
    joined, requests = [], []
    turns = max(len(t) for t in sessions.values())
    for turn in range(turns):
        for name, prompts in sessions.items():
            seq = len(requests)
            rid = f"{name}-turn-{turn}"
            session = None if name == drop_session else name
            requests.append(envelope(seq, prompts[turn], tap="kv", arrival_ms=seq, request_id=rid))
            joined.append(
                envelope(
                    seq,
                    prompts[turn],
                    tap="replay",
                    arrival_ms=seq,
                    request_id=rid,
                    output_tokens=4,
                    session_id=session,
                )
            )
    return joined, requests


class TestSessionStructure:
    """Sessions from the joined records; each turn's prompt must extend the previous one's."""

    def test_growing_turns(self) -> None:
        found = multiturn.session_structure(*records(conversations()))
        assert found == {
            "sessions": 2,
            "turns_per_session": [2],
            "records_without_session": 0,
            "turns_without_request_record": 0,
            "turns_not_extending": 0,
            "first_not_extending": [],
        }

    def test_a_turn_that_does_not_resend_its_history(self) -> None:
        sessions = conversations()
        sessions["conv-b"][1] = SYSTEM + list(range(220, 252))  # b0's own part left out
        found = multiturn.session_structure(*records(sessions))
        assert found["turns_not_extending"] == 1
        assert found["first_not_extending"] == ["conv-b-turn-1"]

    def test_an_equal_prompt_does_not_extend(self) -> None:
        sessions = conversations()
        sessions["conv-a"][1] = list(sessions["conv-a"][0])
        assert multiturn.session_structure(*records(sessions))["turns_not_extending"] == 1

    def test_records_without_a_session(self) -> None:
        found = multiturn.session_structure(*records(conversations(), drop_session="conv-a"))
        assert (found["sessions"], found["records_without_session"]) == (1, 2)

    def test_a_turn_without_its_request_record(self) -> None:
        joined, requests = records(conversations())
        found = multiturn.session_structure(joined, requests[1:])
        assert found["turns_without_request_record"] == 1


class TestLruRate:
    """The rate of the last curve point at or below the capacity."""

    @pytest.mark.parametrize(("capacity", "rate"), [(0, 0.0), (2, 0.0), (3, 0.25), (9, 0.5)])
    def test_steps(self, capacity: int, rate: float) -> None:
        assert multiturn.lru_rate([[3, 0.25], [5, 0.5]], capacity) == rate


def _result(tmp_path: Path, sessions: dict[str, list[list[int]]]) -> dict[str, Any]:
    joined, requests = records(sessions)
    kv = write_records(tmp_path / "kv-history-tracker.rec", requests)
    replay = write_records(tmp_path / "shadow-replay.rec", joined)
    prompt_tokens = sum(len(r["request"]["token_ids"]) for r in requests)
    return {
        "load": {"conversations": 2, "turns": 2},
        "clients": {"frontend_prompt_tokens": prompt_tokens},
        "taps": {"kv-history-tracker": {"records": len(requests)}},
        "records": {"kv-history-tracker": str(kv), "shadow-replay": str(replay)},
        "exit_status": {},
        "failures": [],
        "ok": True,
    }


@pytest.mark.timeout(120)
class TestAddReuse:
    """shadow-trace analyze on the request records, checked against a hand count."""

    def test_hand_counted(self, tmp_path: Path) -> None:
        result = _result(tmp_path, conversations())
        asyncio.run(multiturn.add_reuse(result, tmp_path, tmp_path))
        assert result["ok"], result["failures"]
        assert result["exit_status"] == {"shadow-trace": 0}
        # Block 16: a0 no hit; b0 hits the 2 system blocks; a1 and b1 their 3 blocks.
        # Block 64: no request has a full block before its own.
        rows = {row["block_size"]: row for row in result["reuse"]["block_sizes"]}
        assert rows[16]["requests"] == rows[64]["requests"] == 4
        assert rows[16]["prompt_tokens"] == 224
        assert rows[16]["hit_rate_infinite"] == pytest.approx(128 / 224)
        assert rows[16]["lru"] == {
            str(t): pytest.approx(128 / 224) for t in (4096, 8192, 16384, 32768)
        }
        assert rows[64]["hit_rate_infinite"] == 0.0
        assert result["sessions"]["sessions"] == 2
        assert result["reuse"]["command"].startswith(
            f"shadow-trace analyze {tmp_path / 'kv-history-tracker.rec'} --block-size 16,64"
        )
        text = multiturn.format_reuse(result)
        assert "     16         4         224           57.1%          57.1%" in text
        assert "sessions 2 x 2 turns" in text and "every turn's prompt extends" in text

    def test_what_does_not_hold_fails_the_run(self, tmp_path: Path) -> None:
        result = _result(tmp_path, conversations())
        result["clients"]["frontend_prompt_tokens"] += 1
        result["load"]["turns"] = 3
        asyncio.run(multiturn.add_reuse(result, tmp_path, tmp_path))
        assert not result["ok"]
        assert (
            "reuse (block 16): 224 prompt tokens analyzed, the frontend reports 225"
            in result["failures"]
        )
        assert any("2 sessions with [2] turns" in f for f in result["failures"])


class TestReuseFailures:
    """The analysis must see every record; every conversation is a session of its turns."""

    def _result(self, **sessions: Any) -> dict[str, Any]:
        row = {"block_size": 16, "requests": 6, "prompt_tokens": 600}
        return {
            "load": {"conversations": 2, "turns": 3},
            "clients": {"frontend_prompt_tokens": 600},
            "taps": {"kv-history-tracker": {"records": 6}},
            "reuse": {"block_sizes": [row]},
            "sessions": {
                "sessions": 2,
                "turns_per_session": [3],
                "records_without_session": 0,
                "turns_without_request_record": 0,
                "turns_not_extending": 0,
                "first_not_extending": [],
                **sessions,
            },
        }

    def test_holds(self) -> None:
        assert multiturn.reuse_failures(self._result()) == []

    def test_fewer_requests_analyzed(self) -> None:
        result = self._result()
        result["reuse"]["block_sizes"][0]["requests"] = 5
        assert multiturn.reuse_failures(result) == [
            "reuse (block 16): 5 requests analyzed, the tap holds 6 records"
        ]

    def test_no_figures(self) -> None:
        result = self._result()
        result["reuse"]["block_sizes"] = []
        assert multiturn.reuse_failures(result) == ["shadow-trace analyze wrote no reuse figures"]

    def test_turns_not_extending(self) -> None:
        result = self._result(turns_not_extending=1, first_not_extending=["conv-01-turn-2"])
        assert multiturn.reuse_failures(result) == [
            "1 turns do not extend their previous turn's prompt (e.g. conv-01-turn-2)"
        ]

    def test_a_session_with_fewer_turns(self) -> None:
        (failure,) = multiturn.reuse_failures(self._result(turns_per_session=[2, 3]))
        assert (
            "2 sessions with [2, 3] turns, the clients held 2 conversations of 3 turns" in failure
        )
