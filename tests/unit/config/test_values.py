"""The configuration's values: SPEC section 2's defaults, frozen."""

from __future__ import annotations

import attrs
import pytest

from shadow_proxy.config.values import (
    MIB,
    Listen,
    ModelEntry,
    Publish,
    ResponseOptions,
    TapConfig,
    Upstream,
    WorkerOptions,
)
from shadow_proxy.records.filters import FilterSet


def tap(capture: str) -> TapConfig:
    return TapConfig("t", "shadow-requests-t", capture, "tcp://127.0.0.1:1", FilterSet.parse([]))


class TestDefaults:
    """The defaults SPEC section 2 names."""

    def test_listen_publish_upstream(self) -> None:
        assert (Listen().host, Listen().port) == ("0.0.0.0", 8080)
        assert (Listen().body_timeout_s, Listen().max_connections) == (60.0, 8192)
        # Taps bind loopback unless configured: records hold the prompts.
        assert (Publish().host, Publish().base_port) == ("127.0.0.1", 5557)
        upstream = Upstream("http://f:8000")
        assert upstream.connect_timeout_s == 5.0
        assert upstream.read_timeout_s is None  # LLM streams may pause for long
        assert upstream.max_connections == 1024
        assert upstream.max_request_bytes == 64 * MIB

    def test_response_options(self) -> None:
        options = ResponseOptions()
        assert (options.tokens, options.text, options.max_tokens, options.chunk_timing) == (
            True,
            False,
            None,
            False,
        )

    def test_worker(self) -> None:
        worker = WorkerOptions()
        assert worker.handoff_max_bytes == 256 * MIB
        assert worker.max_in_flight == 4096
        assert (worker.processes, worker.priority, worker.nice) == (None, "idle", 19)
        assert (worker.max_lag_s, worker.max_rss_mb) == (30.0, 1024)
        assert worker.tokenizer_cache_bytes == worker.max_decoded_bytes == 64 * MIB
        assert (worker.max_prompt_bytes, worker.max_request_cpu_s) == (None, 5.0)
        assert worker.malloc == "auto"

    def test_tap(self) -> None:
        t = tap("request")
        assert (t.models, t.sample, t.sample_by, t.response, t.capacity) == (
            (),
            1.0,
            "request",
            None,
            1024,
        )
        assert ModelEntry("m", "/d").context_length is None
        assert ModelEntry("m", "/d").template_engine == "minijinja"


class TestTapConfig:
    """A tap is joined exactly when it captures the response."""

    def test_joined(self) -> None:
        assert tap("request_response").joined
        assert not tap("request").joined

    def test_frozen(self) -> None:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            tap("request").capacity = 5  # type: ignore[misc]
