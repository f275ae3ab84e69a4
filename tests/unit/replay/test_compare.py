"""Per-request comparison: outcome, finish reason, tokens, output equality and the
first divergent position, latency ratios, prompt tokens; Diffy's noise rule."""

from __future__ import annotations

import pytest

from shadow_proxy.replay.compare import (
    Divergence,
    Observation,
    compare,
    counted,
    first_divergence,
    mean_itl_ms,
    primary_observation,
)


def record(**response) -> dict:
    base = {
        "outcome": "complete",
        "choices": [
            {"index": 0, "finish_reason": "length", "output_tokens": 4, "token_ids": [1, 2, 3, 4]}
        ],
        "output_tokens": 4,
        "first_token_offset_ns": 20_000_000,
        "last_token_offset_ns": 50_000_000,
        "end_offset_ns": 60_000_000,
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    return {"request_id": "r", "request": {"token_ids": [0] * 9}, "response": {**base, **response}}


def observed(**fields) -> Observation:
    base = {
        "outcome": "complete",
        "finish_reasons": ("length",),
        "choice_tokens": (4,),
        "output_tokens": 4,
        "exact_tokens": 4,
        "token_ids": ((1, 2, 3, 4),),
        "ttft_ms": 40.0,
        "itl_ms": 20.0,
        "e2e_ms": 120.0,
        "prompt_tokens": 9,
    }
    return Observation(**{**base, **fields})


class TestPrimary:
    """The record's response read as an observation."""

    def test_fields(self) -> None:
        p = primary_observation(record())
        assert p.outcome == "complete"
        assert p.finish_reasons == ("length",)
        assert p.token_ids == ((1, 2, 3, 4),)
        assert p.texts is None
        assert p.ttft_ms == 20.0
        assert p.itl_ms == pytest.approx(10.0)  # (50 - 20) / (4 - 1)
        assert p.e2e_ms == 60.0
        assert p.prompt_tokens == 9

    def test_choices_sorted_and_text(self) -> None:
        choices = [
            {"index": 1, "finish_reason": "stop", "output_tokens": 2, "text": "b"},
            {"index": 0, "finish_reason": "length", "output_tokens": 3, "text": "a"},
        ]
        p = primary_observation(record(choices=choices))
        assert p.finish_reasons == ("length", "stop")
        assert p.texts == ("a", "b")
        assert p.token_ids is None
        assert p.itl_ms == pytest.approx(15.0)  # (50 - 20) / (max(3, 2) - 1)

    def test_one_read_carried_every_token(self) -> None:
        """That read's time is the TTFT (a fast engine's usual case); only the ITL
        is unknown. Leaving such records out timed the primary on its slow ones."""
        p = primary_observation(record(last_token_offset_ns=20_000_000))
        assert p.ttft_ms == 20.0 and p.itl_ms is None and p.e2e_ms == 60.0

    def test_timed_from_the_upstream_send(self) -> None:
        """As the candidate is timed from the replayer's send, the primary is timed
        from the proxy's send to the frontend, not from its arrival at the proxy."""
        p = primary_observation(record(upstream_sent_offset_ns=4_000_000))
        assert (p.ttft_ms, p.e2e_ms, p.timed_from) == (16.0, 56.0, "upstream_send")
        assert p.itl_ms == pytest.approx(10.0)
        assert primary_observation(record()).timed_from == "arrival"  # an older record

    def test_not_streamed_has_no_token_timing(self) -> None:
        """A JSON body brought its first token with the whole answer: no TTFT to compare."""
        p = primary_observation(record(streamed=False, last_token_offset_ns=20_000_000))
        assert (p.ttft_ms, p.itl_ms, p.e2e_ms) == (None, None, 60.0)
        assert primary_observation(record(streamed=True)).ttft_ms == 20.0

    def test_itl_needs_two_tokens(self) -> None:
        assert mean_itl_ms(1, 5, 1) is None
        assert mean_itl_ms(None, 5, 3) is None
        assert mean_itl_ms(0, 4_000_000, 3) == 2.0


class TestCompare:
    """Every compared field, on hand-made pairs."""

    def test_equal(self) -> None:
        d = compare(primary_observation(record()), observed(), 9)
        assert (d.output_equal, d.divergence, d.basis) == (True, None, "token_ids")
        assert not d.outcome_differs and not d.finish_reason_differs
        assert d.output_tokens_delta == 0
        assert (d.ttft_ratio, d.itl_ratio, d.e2e_ratio) == (2.0, 2.0, 2.0)
        assert d.prompt_tokens_differ is False

    def test_divergence_position_and_choice(self) -> None:
        p = primary_observation(record())
        d = compare(p, observed(token_ids=((1, 2, 9, 4),)), 9)
        assert (d.output_equal, d.divergence) == (False, Divergence(0, 2))
        d = compare(p, observed(token_ids=((1, 2, 3),), output_tokens=3, exact_tokens=3), 9)
        assert d.divergence == Divergence(0, 3)
        assert d.output_tokens_delta == -1
        d = compare(p, observed(token_ids=((1, 2, 3, 4), (7,))), 9)
        assert d.divergence == Divergence(1, 0)

    def test_text_basis_when_ids_missing(self) -> None:
        p = primary_observation(
            record(choices=[{"index": 0, "finish_reason": "stop", "text": "hello world"}])
        )
        d = compare(p, observed(token_ids=None, texts=("hello there",)), 9)
        assert (d.basis, d.divergence) == ("text", Divergence(0, 6))
        d = compare(p, observed(token_ids=None, texts=None), 9)
        assert (d.basis, d.output_equal, d.divergence) == ("none", None, None)

    def test_prefix_when_primary_incomplete_or_truncated(self) -> None:
        cancelled = primary_observation(record(outcome="cancelled"))
        d = compare(cancelled, observed(token_ids=((1, 2, 3, 4, 5, 6),)), 9)
        assert (d.prefix, d.output_equal, d.outcome_differs) == (True, True, True)
        cut = record(
            choices=[
                {"index": 0, "finish_reason": "length", "token_ids": [1, 2], "truncated": True}
            ]
        )
        d = compare(primary_observation(cut), observed(), 9)
        assert (d.prefix, d.output_equal) == (True, True)

    def test_token_counts_only_between_exact_counts(self) -> None:
        no_usage = record(usage=None)
        del no_usage["response"]["usage"]
        estimate = primary_observation(no_usage)  # ids retokenized by the proxy
        assert estimate.exact_tokens is None
        assert compare(estimate, observed(exact_tokens=7), 9).output_tokens_delta is None
        no_usage["response"]["token_ids_source"] = "upstream"
        returned = primary_observation(no_usage)
        assert returned.exact_tokens == 4
        assert compare(returned, observed(exact_tokens=7), 9).output_tokens_delta == 3
        assert compare(returned, observed(exact_tokens=None), 9).output_tokens_delta is None

    def test_outcome_finish_prompt(self) -> None:
        p = primary_observation(record())
        d = compare(p, observed(outcome="error", finish_reasons=("stop",), prompt_tokens=8), 9)
        assert d.outcome_differs and d.finish_reason_differs and d.prompt_tokens_differ
        assert compare(p, observed(prompt_tokens=None), 9).prompt_tokens_differ is None

    def test_a_failed_side_is_not_compared(self) -> None:
        """Errors are their own basis (not "no common basis") and have no latency ratios."""
        p = primary_observation(record())
        d = compare(p, observed(outcome="error", token_ids=None, texts=()), 9)
        assert (d.basis, d.output_equal, d.divergence) == ("error", None, None)
        assert (d.ttft_ratio, d.itl_ratio, d.e2e_ratio) == (None, None, None)
        failed_primary = primary_observation(record(outcome="error"))
        assert not failed_primary.succeeded
        assert compare(failed_primary, observed(), 9).basis == "error"

    def test_first_divergence(self) -> None:
        assert first_divergence("abc", "abc") is None
        assert first_divergence("abc", "abd") == 2
        assert first_divergence("ab", "abc") == 2
        assert first_divergence((), (1,)) == 0


class TestNoise:
    """A candidate difference counts only when the baseline does not show it too."""

    def test_counted(self) -> None:
        p = primary_observation(record())
        diverged = compare(p, observed(token_ids=((1, 9, 9, 9),)), 9)
        same = compare(p, observed(), 9)
        assert counted(diverged, None)["output"] is True
        assert counted(diverged, same)["output"] is True
        assert counted(diverged, diverged)["output"] is False
        assert counted(same, diverged)["output"] is False
