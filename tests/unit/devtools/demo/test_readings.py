"""What a demo run reads back: the proxy's metrics, the consumers' totals."""

from __future__ import annotations

from pathlib import Path

from shadow_proxy.devtools.demo.readings import (
    frontend_prompt_tokens,
    load_probe,
    proxy_metrics,
    read_summary,
    tap_totals,
)
from shadow_proxy.devtools.frontend import MockConfig, serve_mock_frontend
from shadow_proxy.devtools.loadgen import LoadSpec, Report, Result, run_load
from shadow_proxy.devtools.processes import reserve_port


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
        metrics = proxy_metrics(text)
        assert metrics["requests"] == {"chat 2xx": 7, "chat 4xx": 3}
        assert metrics["taps"] == {"a": {"queued": 10, "published": 9, "dropped": {"full": 1}}}
        assert metrics["prompt_token_mismatches"] == 2
        assert metrics["not_mirrored"] == {}


class TestConsumerTotals:
    """The summary file, whole or not at all; the totals the demo shows."""

    def test_read_summary(self, tmp_path: Path) -> None:
        path = tmp_path / "s.json"
        assert read_summary(path) is None
        path.write_text('{"records": ')
        assert read_summary(path) is None  # half written
        path.write_text('{"records": 3}')
        assert read_summary(path) == {"records": 3}

    def test_tap_totals(self) -> None:
        totals = tap_totals(
            {
                "records": 3,
                "tap_gaps": 1,
                "errors": {"HTTP 503": 2},
                "extra": 9,
                "publishers": [{}, {}],
                "source": "stream S subject shadow.t durable d at nats://h:1",
            }
        )
        assert totals["records"] == 3 and totals["tap_gaps"] == 1 and totals["publishers"] == 2
        assert totals["source"] == "stream S subject shadow.t durable d at nats://h:1"
        assert "extra" not in totals and totals["outcomes"] is None
        assert totals["errors"] == {"HTTP 503": 2}  # the demo's checks name them


class TestFrontendPromptTokens:
    """Answers with usage count as they are; the others are asked again, straight."""

    async def test_asks_again_for_the_requests_without_usage(
        self, model_dirs: dict[str, Path]
    ) -> None:
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]})
        async with serve_mock_frontend(config) as (url, _):
            spec = LoadSpec(
                url=url, model="deepseek", requests=3, prompt_tokens=20, output_tokens=2
            )
            report = await run_load(spec)
            usage = [r.usage["prompt_tokens"] for r in report.results]
            report.results[1].usage = None  # as if the client had cancelled it
            total, asked, uncounted = await frontend_prompt_tokens(url, report, load_probe(spec))
        assert (total, asked, uncounted) == (sum(usage), 1, 0)

    async def test_responses_are_asked_again_on_their_route(
        self, model_dirs: dict[str, Path]
    ) -> None:
        """The Responses API's probe goes to /v1/responses and counts ``input_tokens``."""
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]})
        async with serve_mock_frontend(config) as (url, _):
            spec = LoadSpec(
                url=url,
                model="deepseek",
                requests=3,
                prompt_tokens=20,
                output_tokens=2,
                api="responses",
            )
            report = await run_load(spec)
            usage = [r.usage["input_tokens"] for r in report.results]
            report.results[0].usage = report.results[2].usage = None
            total, asked, uncounted = await frontend_prompt_tokens(url, report, load_probe(spec))
        assert (total, asked, uncounted) == (sum(usage), 2, 0)

    async def test_a_frontend_that_cannot_say(self) -> None:
        spec = LoadSpec(url="", model="deepseek", requests=2)
        report = Report(spec, [Result(0, usage={"prompt_tokens": 7}), Result(1)], 1.0)
        dead = f"http://127.0.0.1:{reserve_port()}"
        assert await frontend_prompt_tokens(dead, report, load_probe(spec)) == (7, 0, 1)

    async def test_a_request_that_cannot_be_sent_again(self) -> None:
        spec = LoadSpec(url="", model="deepseek", requests=2)
        report = Report(spec, [Result(0, usage={"prompt_tokens": 7}), Result(1)], 1.0)
        dead = f"http://127.0.0.1:{reserve_port()}"
        assert await frontend_prompt_tokens(dead, report, lambda index: None) == (7, 0, 1)
