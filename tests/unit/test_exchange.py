"""Routes: the Responses API is a mirrored route of its own."""

from __future__ import annotations

import pytest

from shadow_proxy.exchange import Route, classify
from shadow_proxy.records.envelope import ORIGINS


class TestResponsesRoute:
    """``POST /v1/responses`` is mirrored, labelled and recorded as ``responses``."""

    @pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/"])
    def test_post_is_mirrored(self, path: str) -> None:
        route = classify("POST", path)
        assert route is Route.RESPONSES
        assert route.mirrored
        assert route.label == "responses"
        assert route.origin == "responses"
        assert route.origin in ORIGINS

    @pytest.mark.parametrize(
        ("method", "path"),
        [("GET", "/v1/responses"), ("GET", "/v1/responses/resp_1"), ("POST", "/v1/responses/x")],
    )
    def test_other_requests_are_not(self, method: str, path: str) -> None:
        assert classify(method, path) is Route.OTHER
