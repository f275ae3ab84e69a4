"""Reuse analysis: SPEC 10's cache model, exact at every LRU capacity."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.trace.blocks import token_array
from shadow_proxy.trace.reuse import ALL, ReuseAnalysis, parse_block_sizes, to_json
from shadow_proxy.trace.selection import TraceRequest


def request(tokens, arrival=0, model="m") -> TraceRequest:
    return TraceRequest(
        arrival_unix_ns=arrival,
        request_id="r",
        model=model,
        tap="kv",
        token_ids=token_array(tokens),
        output_length=None,
        session_id=None,
        end_offset_ns=None,
        joined=False,
    )


def analyze(prompts, sizes=(2,), models=None):
    analysis = ReuseAnalysis(sizes)
    for i, prompt in enumerate(prompts):
        analysis.add(request(prompt, arrival=i, model=models[i] if models else "m"))
    return analysis.result()


def brute_force_hits(prompts, block, capacity, models=None) -> int:
    """SPEC 10's model, replayed with an OrderedDict LRU of ``capacity`` blocks."""
    cache: OrderedDict = OrderedDict()
    hit = 0
    for i, prompt in enumerate(prompts):
        model = models[i] if models else "m"
        keys = [(model, tuple(prompt[: (k + 1) * block])) for k in range(len(prompt) // block)]
        for key in keys:
            if key not in cache:
                break
            hit += block
        for key in reversed(keys):
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = True
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hit


class TestByHand:
    """A four-request trace worked out on paper (B = 2)."""

    # a0 = [1,2], a1 = [1,2,3,4], b1 = [1,2,5,6]
    PROMPTS = ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 3, 4])

    def test_curve(self):
        curve = analyze(self.PROMPTS)[ALL][2]
        # R2 hits a0 at depth 1, a1 at 2; R3 hits a0 at 1; R4 hits a0 at 1, a1 at 3.
        assert curve.hist.tolist() == [3, 3, 1, 1]
        assert curve.lru_points() == [[1, 6 / 16], [2, 8 / 16], [3, 10 / 16]]
        assert curve.hit_rate() == 10 / 16
        assert [curve.hit_tokens(c) for c in (1, 2, 3, 99)] == [6, 8, 10, 10]
        assert (curve.requests, curve.prompt_tokens, curve.full_blocks) == (4, 16, 8)

    def test_reuse_distance_percentiles(self):
        curve = analyze(self.PROMPTS)[ALL][2]
        assert [curve.reuse_distance(p) for p in (50, 90, 99)] == [1, 3, 3]

    def test_json(self):
        doc = to_json(analyze(self.PROMPTS))
        entry = doc["all"]["2"]
        assert entry["requests"] == 4 and entry["prompt_tokens"] == 16
        assert entry["hit_rate_infinite"] == 10 / 16
        assert entry["lru"] == [[1, 0.375], [2, 0.5], [3, 0.625]]
        assert doc["models"]["m"]["2"] == entry


class TestCacheModel:
    def test_partial_blocks_are_not_cached(self):
        curve = analyze([[1, 2, 3], [1, 2, 3]])[ALL][2]
        assert curve.hit_tokens() == 2 and curve.prompt_tokens == 6

    def test_leaf_touched_first_so_the_root_survives(self):
        # capacity 1: after [1,2,3,4] the cache must hold the root [1,2], not the leaf
        curve = analyze([[1, 2, 3, 4], [1, 2, 3, 4]])[ALL][2]
        assert curve.hit_tokens(1) == 2

    def test_only_leading_blocks_hit(self):
        # block [1,2,3,4] is cached but [1,2] is not reached first: a prefix miss
        curve = analyze([[1, 2, 3, 4], [9, 9, 3, 4]])[ALL][2]
        assert curve.hit_tokens() == 0

    def test_arrival_order_not_input_order(self):
        analysis = ReuseAnalysis((2,))
        analysis.add(request([1, 2], arrival=10))
        analysis.add(request([1, 2], arrival=30))
        analysis.add(request([3, 4], arrival=20))
        curve = analysis.result()[ALL][2]
        # in arrival order [3,4] comes between the two [1,2]: depth 2, no hit at capacity 1
        assert curve.hit_tokens(1) == 0 and curve.hit_tokens(2) == 2

    def test_models_never_share_blocks(self):
        result = analyze([[1, 2], [1, 2], [1, 2]], models=["a", "b", "a"])
        assert result[ALL][2].hit_tokens() == 2
        assert result["a"][2].hit_tokens() == 2 and result["a"][2].requests == 2
        assert result["b"][2].hit_tokens() == 0 and result["b"][2].requests == 1

    def test_several_block_sizes_in_one_pass(self):
        result = analyze([[1, 2, 3, 4], [1, 2, 3, 4]], sizes=(1, 2, 4, 8))
        assert {b: c.hit_tokens() for b, c in result[ALL].items()} == {1: 4, 2: 4, 4: 4, 8: 0}

    def test_empty(self):
        curve = ReuseAnalysis((2,)).result()[ALL][2]
        assert curve.requests == 0 and curve.hit_rate() == 0.0 and curve.lru_points() == []
        assert curve.reuse_distance(50) is None

    def test_block_size_list(self):
        assert parse_block_sizes("16, 64,512,64") == (16, 64, 512)
        for bad in ("0", "x", "16,,64", "-4"):
            with pytest.raises(ValueError, match="block-size"):
                parse_block_sizes(bad)


def _check_against_brute_force(prompts, sizes, models=None):
    result = analyze(prompts, sizes=sizes, models=models)
    for size in sizes:
        curve = result[ALL][size]
        distinct = sum(len(p) // size for p in prompts) + 2
        for capacity in range(1, distinct + 1):
            assert curve.hit_tokens(capacity) == brute_force_hits(
                prompts, size, capacity, models
            ), (size, capacity)
        points = dict((c, r) for c, r in curve.lru_points())
        rate = 0.0
        for capacity in range(1, distinct + 1):
            rate = points.get(capacity, rate)
            assert rate == pytest.approx(curve.hit_rate(capacity))


tokens = st.integers(0, 3)


@st.composite
def conversations(draw):
    """Multi-turn traffic: each turn extends its own conversation's history
    (previous prompt + an answer + a new user message), turns interleaved."""
    count = draw(st.integers(1, 4))
    system = draw(st.lists(tokens, max_size=4))
    history = [list(system) for _ in range(count)]
    prompts, models = [], []
    for _ in range(draw(st.integers(1, 14))):
        c = draw(st.integers(0, count - 1))
        history[c] = history[c] + draw(st.lists(tokens, min_size=1, max_size=5))
        prompts.append(list(history[c]))
        models.append(f"m{c % 2}")
        history[c] = history[c] + draw(st.lists(tokens, max_size=3))  # the answer
    return prompts, models


class TestAgainstBruteForce:
    """At every capacity the curve equals an OrderedDict LRU replay."""

    @settings(max_examples=120, deadline=None)
    @given(st.lists(st.lists(tokens, max_size=12), min_size=1, max_size=14))
    def test_random(self, prompts):
        _check_against_brute_force(prompts, (1, 2, 3))

    @settings(max_examples=120, deadline=None)
    @given(conversations())
    def test_multi_turn(self, workload):
        prompts, _ = workload
        _check_against_brute_force(prompts, (1, 2, 4))

    @settings(max_examples=60, deadline=None)
    @given(conversations())
    def test_multi_turn_two_models(self, workload):
        prompts, models = workload
        _check_against_brute_force(prompts, (1, 3), models)

    def test_larger_random_trace(self):
        rng = np.random.default_rng(7)
        roots = [rng.integers(0, 50, 40).tolist() for _ in range(6)]
        prompts = []
        for _ in range(150):
            root = roots[rng.integers(0, len(roots))]
            prompts.append(root[: rng.integers(0, 40)] + rng.integers(0, 3, 6).tolist())
        _check_against_brute_force(prompts, (4,))
