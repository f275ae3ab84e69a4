"""What a demo run reads back: the proxy's metrics, the consumers' totals."""

from __future__ import annotations

from shadow_proxy.devtools import demo


class TestProxyMetrics:
    """The demo reads the proxy's Prometheus text into plain totals."""

    def test_parse(self):
        text = "\n".join(
            [
                "# TYPE shadow_proxy_requests counter",
                'shadow_proxy_requests_total{route="chat",status_class="2xx"} 7.0',
                'shadow_proxy_requests_total{route="chat",status_class="4xx"} 3.0',
                "# TYPE shadow_tap_queued counter",
                'shadow_tap_queued_total{tap="a"} 10.0',
                "# TYPE shadow_tap_published counter",
                'shadow_tap_published_total{tap="a"} 9.0',
                "# TYPE shadow_tap_dropped counter",
                'shadow_tap_dropped_total{reason="full",tap="a"} 1.0',
                "# TYPE shadow_prompt_token_mismatches counter",
                'shadow_prompt_token_mismatches_total{model="m"} 2.0',
                "",
            ]
        )
        metrics = demo.proxy_metrics(text)
        assert metrics["requests"] == {"chat 2xx": 7, "chat 4xx": 3}
        assert metrics["taps"] == {"a": {"queued": 10, "published": 9, "dropped": {"full": 1}}}
        assert metrics["prompt_token_mismatches"] == 2
        assert metrics["not_mirrored"] == {}
