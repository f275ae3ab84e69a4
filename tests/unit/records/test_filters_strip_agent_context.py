"""strip-agent-context removes every field that carries a session or conversation
id, field by field; deep input costs one tap a counted drop, never a crash."""

from __future__ import annotations

import pytest

from shadow_proxy.records.filters import MAX_DEPTH, FilterSet, ProjectionError
from shadow_proxy.records.preprocessed import PreprocessedRequest

SESSION = "sess-SECRET-1"


def request(**fields) -> PreprocessedRequest:
    base = {
        "model": "m",
        "token_ids": [1, 2],
        "stop_conditions": {},
        "sampling_options": {},
        "output_options": {},
        "eos_token_ids": [2],
    }
    return PreprocessedRequest(**{**base, **fields})


def stripped(pre: PreprocessedRequest) -> dict:
    return FilterSet.parse(["strip-agent-context"]).project(pre)


def kept(pre: PreprocessedRequest) -> dict:
    return FilterSet.parse([]).project(pre)


#: Each place a session id can be, as Dynamo 1.6.1 fills it (first two) or other
#: frontends might (the rest): the field that holds it, and the request.
PLACES = {
    "agent_context": request(
        agent_context={"session_id": SESSION, "agent_headers": {"thread-id": [SESSION]}}
    ),
    "image_cache_scope": request(image_cache_scope=SESSION),
    "routing.session_id": request(routing={"session_id": SESSION, "priority": 1}),
    "routing.routing_constraints.conversation_id": request(
        routing={"routing_constraints": {"conversation_id": SESSION, "required_taints": ["a"]}}
    ),
    "routing.router.session": request(routing={"router": {"session": {"id": SESSION}}}),
    "extra_args.nvext.metadata.session_id": request(
        extra_args={"nvext": {"metadata": {"session_id": SESSION}}}
    ),
    "extra_args nested list": request(extra_args={"x": [{"y": [{"conversation": SESSION}]}]}),
    "annotations": request(annotations=[f"session:{SESSION}"]),
}


class TestFieldByField:
    @pytest.mark.parametrize("place", sorted(PLACES))
    def test_present_without_filter_gone_with_it(self, place: str) -> None:
        pre = PLACES[place]
        assert SESSION in repr(kept(pre))
        assert SESSION not in repr(stripped(pre))

    def test_other_routing_and_extra_args_kept(self) -> None:
        pre = request(
            routing={
                "routing_constraints": {"conversation_id": "c", "required_taints": ["a"]},
                "priority": 1,
                "cache_salt": "tenant",
            },
            extra_args={"nvext": {"extra_fields": ["timing"], "cache_salt": "tenant"}},
        )
        copy = stripped(pre)
        assert copy["routing"] == {
            "routing_constraints": {"required_taints": ["a"]},
            "priority": 1,
            "cache_salt": "tenant",
        }
        assert copy["extra_args"] == {"nvext": {"extra_fields": ["timing"], "cache_salt": "tenant"}}


class TestDepth:
    def nested(self, depth: int) -> dict:
        value: dict = {"leaf": 1}
        for _ in range(depth):
            value = {"a": [value]}
        return value

    def test_deep_input_is_a_projection_error(self) -> None:
        pre = request(extra_args={"x": self.nested(500)})
        with pytest.raises(ProjectionError):
            stripped(pre)
        assert "extra_args" in kept(pre)  # only the walking tap is affected

    def test_what_dynamo_accepts_is_copied(self) -> None:
        """A field nested 100 levels deep (Dynamo's parser takes 128) reaches the
        tap that strips session keys (at 64 the strip refused it)."""
        deep = self.nested(50)  # 50 maps each holding a list: 100 levels
        pre = request(extra_args={"x": deep, "session_id": "s"})
        assert stripped(pre)["extra_args"] == {"x": deep}
        assert kept(pre)["extra_args"] == {"x": deep, "session_id": "s"}

    def test_within_the_limit_is_copied(self) -> None:
        pre = request(extra_args={"x": self.nested(MAX_DEPTH // 2 - 2)})
        assert stripped(pre)["extra_args"] == {"x": self.nested(MAX_DEPTH // 2 - 2)}
