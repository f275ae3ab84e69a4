"""Which records become trace requests: each record used at most once, every
refused record counted under one reason, and what a used one contributes."""

from __future__ import annotations

import pytest

from shadow_proxy.trace.selection import Selection
from tests.support.trace_records import T0, envelope


class TestDedup:
    """A record counts once per (publisher_id, tap, seq); without a publisher id,
    per (tap, seq, request id, arrival)."""

    def test_with_publisher_ids(self) -> None:
        selection = Selection()
        record = envelope(0, [1, 2])
        assert selection.take(record, 7) is not None
        assert selection.take(record, 7) is None
        assert selection.take(record, 8) is not None  # another proxy's seq 0
        assert (selection.records, selection.kept, selection.duplicates) == (3, 2, 1)

    def test_without_publisher_ids(self) -> None:
        selection = Selection()
        assert selection.take(envelope(0, [1], request_id="a")) is not None
        assert selection.take(envelope(0, [1], request_id="a")) is None
        assert selection.take(envelope(0, [1], request_id="b")) is not None
        assert selection.take(envelope(0, [1], request_id="a", arrival_ms=5)) is not None
        assert selection.duplicates == 1

    def test_a_batchs_prompts_are_records_of_their_own(self) -> None:
        selection = Selection()
        first, second = envelope(0, [1], request_id="r"), envelope(0, [2], request_id="r")
        first["prompt_index"], second["prompt_index"] = 0, 1
        taken = [selection.take(first), selection.take(second)]
        assert [t.request_id for t in taken if t is not None] == ["r-0", "r-1"]


class TestRefused:
    """Every record that is not used is counted under one reason."""

    @pytest.mark.parametrize(
        ("change", "reason"),
        [
            (lambda e: e.pop("tap"), "no_tap_or_seq"),
            (lambda e: e.update(seq=-1), "no_tap_or_seq"),
            (lambda e: e.update(request="x"), "no_request"),
            (lambda e: e.update(arrival_unix_ns=True), "no_arrival"),
            (lambda e: e["request"].update(token_ids=[1, -2]), "bad_token_ids"),
        ],
    )
    def test_invalid(self, change, reason: str) -> None:
        record = envelope(0, [1, 2])
        change(record)
        selection = Selection()
        assert selection.take(record) is None
        assert selection.invalid == {reason: 1} and selection.kept == 0

    def test_not_a_map(self) -> None:
        selection = Selection()
        assert selection.take(["x"]) is None  # type: ignore[arg-type]
        assert selection.summary()["invalid"] == {"not_a_map": 1}

    def test_without_token_ids_and_other_taps(self) -> None:
        selection = Selection(taps={"kv"})
        assert selection.take(envelope(0, None)) is None
        assert selection.take(envelope(1, [])) is None
        assert selection.take(envelope(0, [1], tap="other")) is None
        assert selection.summary() == {
            "records": 3,
            "used": 0,
            "duplicates": 0,
            "without_token_ids": 2,
            "invalid": {},
            "other_tap": 1,
        }
        assert "other_tap" not in Selection().summary()


class TestRequest:
    """What a used record contributes."""

    def test_request_record(self) -> None:
        taken = Selection().take(envelope(3, [5, 6, 7], max_tokens=9, session_id="s", model="q"))
        assert taken is not None
        assert (taken.arrival_unix_ns, taken.model, taken.tap) == (T0, "q", "kv")
        assert taken.token_ids.tolist() == [5, 6, 7] and taken.input_length == 3
        assert (taken.output_length, taken.session_id, taken.joined) == (9, "s", False)
        assert taken.end_offset_ns is None and taken.first_token_offset_ns is None

    def test_joined_record(self) -> None:
        taken = Selection().take(envelope(3, [5], output_tokens=4, end_ms=50, max_tokens=9))
        assert taken is not None and taken.joined
        assert taken.output_length == 4  # the response's, not max_tokens
        assert (taken.end_offset_ns, taken.first_token_offset_ns) == (50_000_000, 20_500_000)

    def test_missing_counts_and_model(self) -> None:
        record = envelope(0, [1], max_tokens=None)
        record["request"]["model"] = 3
        record["request"]["agent_context"] = {"session_id": ""}
        taken = Selection().take(record)
        assert taken is not None
        assert (taken.output_length, taken.model, taken.session_id) == (None, "", None)
