"""Routes and end kinds: a fixed vocabulary, whatever the client sends."""

from __future__ import annotations

import pytest

from shadow_proxy.exchange import EndKind, Route, classify
from shadow_proxy.records.envelope import ORIGINS


class TestClassify:
    """Only POSTs to the generation paths are mirrored; any other path is ``other``."""

    @pytest.mark.parametrize(
        ("method", "path", "route"),
        [
            ("POST", "/v1/chat/completions", Route.CHAT),
            ("POST", "/v1/chat/completions/", Route.CHAT),
            ("POST", "/v1/completions", Route.COMPLETIONS),
            ("GET", "/v1/models", Route.MODELS),
            ("GET", "/v1/models/", Route.MODELS),
            ("POST", "/v1/models", Route.MODELS),
            ("GET", "/v1/chat/completions", Route.OTHER),
            ("PUT", "/v1/completions", Route.OTHER),
            ("POST", "/v1/chat/completions/x", Route.OTHER),
            ("POST", "/V1/CHAT/COMPLETIONS", Route.OTHER),
            ("POST", "/v1/embeddings", Route.OTHER),
            ("GET", "/", Route.OTHER),
            ("GET", "/a/b/c/secret-path", Route.OTHER),
        ],
    )
    def test_routes(self, method: str, path: str, route: Route) -> None:
        assert classify(method, path) is route

    def test_mirrored_routes(self) -> None:
        assert {r for r in Route if r.mirrored} == {Route.CHAT, Route.COMPLETIONS, Route.RESPONSES}


class TestRouteLabels:
    """Labels and origins come from the enum, never from a path."""

    def test_labels(self) -> None:
        assert [r.label for r in Route] == ["other", "chat", "completions", "models", "responses"]

    def test_origins(self) -> None:
        origins = {r: r.origin for r in Route}
        assert origins == {
            Route.OTHER: "other",
            Route.CHAT: "chat",
            Route.COMPLETIONS: "completions",
            Route.MODELS: "other",
            Route.RESPONSES: "responses",
        }


class TestWireValues:
    """Routes and end kinds travel as one byte in the hand-off: their values are fixed."""

    def test_route_values(self) -> None:
        assert [int(r) for r in Route] == [0, 1, 2, 3, 4]

    def test_end_kind_values(self) -> None:
        assert {k.name: int(k) for k in EndKind} == {
            "CLEAN": 0,
            "CLIENT_GONE": 1,
            "UPSTREAM_BROKEN": 2,
            "TIMEOUT": 3,
            "UPSTREAM_FAILED": 4,
            "SHUTDOWN": 5,
            "CAPTURE_LOST": 6,
        }


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
