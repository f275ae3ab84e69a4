"""Filters: parsing, selection, the explicit projection and sampling."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow_proxy.records import filters
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.records.preprocessed import FIELD_NAMES, PreprocessedRequest

SECRET = "sk-live-SECRET-0123456789"


def full_request(**overrides) -> PreprocessedRequest:
    """A request with every field filled, pins and session ids in every place."""
    fields = {
        "model": "m",
        "token_ids": [1, 2, 3, 4],
        "stop_conditions": {"max_tokens": 16, "stop_token_ids_hidden": [2]},
        "sampling_options": {"temperature": 0.5, "n": 1},
        "output_options": {"logprobs": 1},
        "eos_token_ids": [2],
        "annotations": ["formatted_prompt"],
        "routing": {
            "backend_instance_id": 7,
            "prefill_worker_id": 8,
            "decode_worker_id": 9,
            "dp_rank": 1,
            "prefill_dp_rank": 0,
            "allowed_worker_ids": [7],
            "priority": 3,
            "expected_output_tokens": 100,
            "lora_name": "adapter",
            "session_id": "sess-1",
            "conversation_id": "conv-1",
            "something_new": "x",
        },
        "extra_args": {
            "nvext": {"cache_salt": "salt", "metadata": {"session_id": "sess-1"}},
            "session_key": "sess-1",
            "image_embeds": "AAAA",
        },
        "multi_modal_data": {"image_url": ["http://x/cat.png"], "prompt_embeds": "BBBB"},
        "agent_context": {"session_id": "sess-1", "parent_session_id": "sess-0"},
        "image_cache_scope": "sess-1",
        "mdc_sum": "abc123",
        "request_timestamp_ms": 1_700_000_000_000,
        "prompt_spans": {"answers": [{"message": 1, "start": 3, "end": 9}]},
    }
    fields.update(overrides)
    return PreprocessedRequest(**fields)


def project(names, pre=None):
    return FilterSet.parse(names).project(pre or full_request())


class TestParse:
    """parse resolves names, defaults included, and names the culprit on error."""

    def test_default_strips_worker_pins(self):
        assert FilterSet.parse([]).names == ("strip-worker-pins",)

    def test_keep_worker_pins_replaces_the_default(self):
        assert FilterSet.parse(["keep-worker-pins"]).names == ("keep-worker-pins",)

    def test_names_in_effect(self):
        parsed = FilterSet.parse(["strip-worker-pins", "tokens-only", "max-tokens=8"])
        assert parsed.names == ("tokens-only", "max-tokens=8", "strip-worker-pins")
        assert parsed.max_tokens == 8

    @pytest.mark.parametrize(
        ("names", "message"),
        [
            (["strip-foo"], "unknown filter 'strip-foo' (known: strip-worker-pins"),
            (
                ["keep-worker-pins", "tokens-only"],
                "'keep-worker-pins' conflicts with 'tokens-only'",
            ),
            (["keep-worker-pins", "strip-worker-pins"], "conflicts with 'strip-worker-pins'"),
            (["max-tokens=x"], "'max-tokens=N' needs a positive integer (got 'max-tokens=x')"),
            (["max-tokens=0"], "(got 'max-tokens=0')"),
            (["max-tokens=-3"], "(got 'max-tokens=-3')"),
            (["max-tokens="], "(got 'max-tokens=')"),
            (["max-tokens=1", "max-tokens=2"], "'max-tokens=N' is given twice"),
            (["strip-embeds", "strip-embeds"], "'strip-embeds' is given twice"),
            ("tokens-only", "must be a list"),
            ([3], "must be a string (got 3)"),
        ],
    )
    def test_errors(self, names, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            FilterSet.parse(names)

    def test_projection_key_shared_by_equivalent_sets(self):
        a = FilterSet.parse(["strip-embeds", "max-tokens=5"])
        b = FilterSet.parse(["skip-multimodal", "strip-embeds", "strip-worker-pins"])
        assert a.projection_key == b.projection_key
        assert hash(a.projection_key) == hash(b.projection_key)
        assert a.projection_key != FilterSet.parse([]).projection_key
        assert (
            FilterSet.parse([]).projection_key
            != FilterSet.parse(["keep-worker-pins"]).projection_key
        )


class TestExhaustive:
    """Every field of PreprocessedRequest has a decided fate."""

    def test_every_field_is_decided(self):
        assert set(filters.FIELD_DECISIONS) == set(FIELD_NAMES)

    def test_projection_reads_only_decided_fields(self):
        """With nothing stripped, the copy has every field and nothing else."""
        copy = project(["keep-worker-pins"])
        assert set(copy) == set(FIELD_NAMES)


class TestProjection:
    """Each filter drops what it names and leaves the rest alone."""

    def test_default_strips_pins_and_keeps_workload_hints(self):
        copy = project([])
        assert copy["routing"] == {
            "priority": 3,
            "expected_output_tokens": 100,
            "lora_name": "adapter",
            "session_id": "sess-1",
            "conversation_id": "conv-1",
        }
        for kept in ("extra_args", "multi_modal_data", "agent_context", "annotations", "mdc_sum"):
            assert kept in copy

    def test_keep_worker_pins(self):
        routing = project(["keep-worker-pins"])["routing"]
        assert routing["backend_instance_id"] == 7
        assert routing["allowed_worker_ids"] == [7]
        assert routing["dp_rank"] == 1

    def test_unknown_routing_keys_are_not_copied(self):
        assert "something_new" not in project(["keep-worker-pins"])["routing"]

    def test_strip_multimodal(self):
        copy = project(["strip-multimodal"])
        assert "multi_modal_data" not in copy
        assert copy["extra_args"]["image_embeds"] == "AAAA"

    def test_strip_embeds_in_both_places(self):
        copy = project(["strip-embeds"])
        assert copy["multi_modal_data"] == {"image_url": ["http://x/cat.png"]}
        assert "image_embeds" not in copy["extra_args"]
        assert copy["extra_args"]["nvext"]["cache_salt"] == "salt"

    def test_strip_extra_args(self):
        copy = project(["strip-extra-args"])
        assert "extra_args" not in copy
        assert "multi_modal_data" in copy

    def test_strip_agent_context_removes_session_ids_everywhere(self):
        copy = project(["strip-agent-context"])
        assert "agent_context" not in copy
        assert "annotations" not in copy
        assert "session_id" not in copy["routing"]
        assert "conversation_id" not in copy["routing"]
        assert "session_key" not in copy["extra_args"]
        assert copy["extra_args"]["nvext"] == {"cache_salt": "salt", "metadata": {}}
        assert "sess-" not in json.dumps(copy)
        assert copy["routing"]["lora_name"] == "adapter"

    def test_tokens_only(self):
        copy = project(["tokens-only"])
        assert set(copy) == {
            "model",
            "token_ids",
            "stop_conditions",
            "sampling_options",
            "output_options",
            "eos_token_ids",
            "request_timestamp_ms",
            "prompt_spans",  # token positions and the template's text: closed-loop replay
        }

    def test_empty_optional_fields_are_left_out(self):
        pre = PreprocessedRequest("m", [1], {}, {}, {}, [])
        copy = FilterSet.parse([]).project(pre)
        assert set(copy) == {
            "model",
            "token_ids",
            "stop_conditions",
            "sampling_options",
            "output_options",
            "eos_token_ids",
        }
        assert None not in copy.values()

    def test_routing_left_empty_by_stripping_is_left_out(self):
        pre = full_request(routing={"dp_rank": 1})
        assert "routing" not in FilterSet.parse([]).project(pre)

    def test_source_is_not_changed(self):
        pre = full_request()
        before = json.dumps(attrs_dict(pre), sort_keys=True)
        project(["tokens-only"], pre)
        project(["strip-agent-context", "strip-embeds"], pre)
        assert json.dumps(attrs_dict(pre), sort_keys=True) == before


def attrs_dict(pre: PreprocessedRequest) -> dict:
    return {name: getattr(pre, name) for name in FIELD_NAMES}


class TestSecretsStayOut:
    """A credential can only reach a record through a field the projection names.

    Headers are not an input of PreprocessedRequest at all; a value a client puts
    in the body reaches the record only where the body maps to a field, and
    tokens-only keeps none of the free-form ones.
    """

    def test_headers_are_not_an_input(self):
        for name in FIELD_NAMES:
            assert "header" not in name.lower()
            assert "auth" not in name.lower()

    def test_free_form_places_are_dropped_by_tokens_only(self):
        pre = full_request(
            routing={"session_id": SECRET, "authorization": f"Bearer {SECRET}", "priority": 1},
            extra_args={"api_key": SECRET, "nvext": {"authorization": SECRET}},
            multi_modal_data={"image_url": [f"http://u:{SECRET}@x/i.png"]},
            agent_context={"session_id": SECRET},
            annotations=[SECRET],
            mdc_sum=SECRET,
        )
        assert SECRET not in json.dumps(project(["tokens-only"], pre))

    def test_unknown_routing_keys_never_leak(self):
        pre = full_request(routing={"authorization": f"Bearer {SECRET}", "api_key": SECRET})
        assert SECRET not in json.dumps(project(["keep-worker-pins"], pre))


class TestSelect:
    """select skips what skip-multimodal and max-tokens exclude, with a fixed reason."""

    def test_takes_by_default(self):
        assert FilterSet.parse([]).select(full_request()) is None

    def test_skip_multimodal(self):
        skip = FilterSet.parse(["skip-multimodal"])
        assert skip.select(full_request()) == "skip-multimodal"
        text_only = full_request(multi_modal_data={}, extra_args={})
        assert skip.select(text_only) is None
        embeds = full_request(multi_modal_data={}, extra_args={"prompt_embeds": "x"})
        assert skip.select(embeds) == "skip-multimodal"

    def test_max_tokens(self):
        assert FilterSet.parse(["max-tokens=4"]).select(full_request()) is None
        assert FilterSet.parse(["max-tokens=3"]).select(full_request()) == "max-tokens"

    def test_reasons_come_from_the_vocabulary(self):
        assert {"skip-multimodal", "max-tokens"} == filters.SKIP_REASONS


class TestSampling:
    """Sampling is a stable hash: same fraction same answer, smaller fraction a subset."""

    def test_edges(self):
        assert filters.sample_in(b"x", 1.0)
        assert not filters.sample_in(b"x", 0.0)
        with pytest.raises(ValueError, match="sample"):
            filters.sample_in(b"x", 1.5)

    @given(st.binary(max_size=32), st.floats(0, 1), st.floats(0, 1))
    def test_smaller_fraction_takes_a_subset(self, key, a, b):
        low, high = sorted((a, b))
        if filters.sample_in(key, low):
            assert filters.sample_in(key, high)

    def test_hash_is_stable(self):
        """Every proxy process, today and after an upgrade, decides alike."""
        decided = [filters.sample_in(filters.request_sample_key(f"req-{i}"), 0.5) for i in range(8)]
        assert decided == [True, True, True, True, True, False, True, False]
        assert filters.prefix_sample_key([1, 2, 3]).hex() == "ece519772ca994e118c83b5983764d75"

    def test_fraction_is_roughly_kept(self):
        keys = [filters.request_sample_key(f"req-{i}") for i in range(4000)]
        taken = sum(filters.sample_in(k, 0.25) for k in keys)
        assert 800 < taken < 1200

    def test_prefix_key_uses_the_first_64_tokens(self):
        prompt = list(range(100))
        same_prefix = [*range(64), 999]
        assert filters.prefix_sample_key(prompt) == filters.prefix_sample_key(same_prefix)
        assert filters.prefix_sample_key(prompt) != filters.prefix_sample_key([1, *prompt])
        assert filters.prefix_sample_key([1, 2]) != filters.prefix_sample_key([1, 2, 3])
