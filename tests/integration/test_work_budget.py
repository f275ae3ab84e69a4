"""Hostile input (issue 18 items 1 and 5): one request cannot take the worker's memory
or stall other requests' records; a shard over worker.max_rss_mb is replaced between
requests with every record accounted for."""

from __future__ import annotations

import asyncio
import io
import itertools
import time
from pathlib import Path

import aiohttp
import pytest
import zmq

from shadow_proxy.devtools.frontend.generation import gzip_bomb
from shadow_proxy.devtools.loadgen import many_tools
from shadow_proxy.devtools.processes import wait_until as wait_for
from shadow_proxy.serving.supervisor import TAPS
from tests.integration.workers import (
    BOMB_HEADER,
    HANG_HEADER,
    START_S,
    Consumer,
    chat,
    close_consumers,
    plain_frontend,
    sample,
    shard_pids,
    status,
    tap,
)
from tests.support.servers import proxy_config, run_proxy, serve

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    close_consumers()
    context.term()


def config_for(frontend, model_dirs, *taps, **worker):
    return proxy_config(
        frontend,
        models=[{"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])}],
        taps=list(taps),
        worker={"processes": 1, **worker},
    )


class TestHugeRequest:
    """A 60 MB request of 600 tools x 1,000 properties: not rendered, not encoded
    (prompt_over_budget); the shard's peak memory stays within a few hundred MB."""

    async def test_memory_bounded(self, model_dirs, context):
        body = many_tools("deepseek", 600, 1000)
        assert len(body) > 62_000_000
        async with serve(plain_frontend()) as frontend:
            config = config_for(frontend, model_dirs, tap("kv"))
            async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
                consumer = Consumer(context, config.taps[0].endpoint, config.taps[0].topic)
                await wait_for(consumer.got_heartbeat, timeout=10)
                (shard,) = shard_pids(app[TAPS].process.pid)
                before = status(shard, "VmHWM")
                headers = {"content-type": "application/json"}
                data = io.BytesIO(body)
                async with s.post(url + "/v1/chat/completions", data=data, headers=headers) as r:
                    assert r.status == 200
                    await r.read()
                await wait_for(
                    lambda: (
                        sample(registry, "shadow_not_mirrored_total", reason="prompt_over_budget")
                        == 1
                    ),
                    timeout=30,
                )
                peak_mib = (status(shard, "VmHWM") - before) / 1024
                assert peak_mib < 600, peak_mib  # measured: about +330 MiB for 55 MB
                async with s.post(url + "/v1/chat/completions", json=chat("next")) as r:
                    await r.read()
                await wait_for(lambda: consumer.has(1), timeout=10)


#: The bomb's request without max_tokens: only the context length (32k) bounds
#: its events then (131k of them, over a second of parsing).
UNBOUNDED = chat("bomb")
del UNBOUNDED["max_tokens"]


class TestGzipBomb:
    """A gzip SSE response that expands to 256 MiB (3 million events, each 64 KiB
    write of it about 64 MiB) is read until the first budget it meets, and no
    further: its record says which; other requests' records and the heartbeats
    keep their pace. Each budget in turn, the others set out of its way."""

    @pytest.mark.parametrize(
        ("budget", "body", "worker"),
        [
            ("decoded", UNBOUNDED, {"max_decoded_bytes": 4 << 20, "max_request_cpu_s": 120}),
            # max_tokens 4: at most 4 x 4 + 256 events.
            ("events", chat("bomb"), {"max_request_cpu_s": 120}),
            # 64 MiB would be met first if the CPU were checked only between messages.
            ("cpu", UNBOUNDED, {"max_request_cpu_s": 0.3}),
        ],
    )
    async def test_bounded_and_others_unaffected(self, model_dirs, context, budget, body, worker):
        bomb = gzip_bomb(256)  # MiB
        async with serve(plain_frontend(bomb)) as frontend:
            config = config_for(frontend, model_dirs, tap("replay", "request_response"), **worker)
            raw = aiohttp.ClientSession(auto_decompress=False)
            async with run_proxy(config) as (url, registry, app), raw as s:
                consumer = Consumer(context, config.taps[0].endpoint, config.taps[0].topic)
                await wait_for(consumer.got_heartbeat, timeout=10)
                async with s.post(
                    url + "/v1/chat/completions", json=body, headers={BOMB_HEADER: "1"}
                ) as r:
                    assert r.headers["Content-Encoding"] == "gzip"
                    assert await r.read() == bomb  # the client gets the bytes as they were
                started = time.monotonic()
                for i in range(10):
                    async with s.post(url + "/v1/chat/completions", json=chat(f"q{i}")) as r:
                        await r.read()
                await wait_for(lambda: consumer.has(11), timeout=30)
                assert time.monotonic() - started < 6
                (bombed,) = [r for r in consumer.records if r["response"]["outcome"] != "complete"]
                assert bombed["response"]["outcome"] == "incomplete"
                assert "work budget" in bombed["response"]["error"]
                await wait_for(
                    lambda: (
                        sample(registry, "shadow_worker_budget_exceeded_total", budget=budget) == 1
                    )
                )
                beats = [m.published_at_ms for m, _ in consumer.heartbeats]
                gaps = [b - a for a, b in itertools.pairwise(beats)]
                assert max(gaps, default=0) < 1600, gaps


class TestRecycle:
    """Over worker.max_rss_mb the shard is replaced between requests: the new one
    takes new requests, the old one finishes its streams; nothing is lost."""

    async def test_replaced_without_loss(self, model_dirs, context):
        async with serve(plain_frontend()) as frontend:
            config = config_for(
                frontend,
                model_dirs,
                tap("kv"),
                tap("replay", "request_response"),
                max_rss_mb=64,  # below any shard: the first is replaced after its first request
            )
            async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
                consumers = {t.name: Consumer(context, t.endpoint, t.topic) for t in config.taps}
                for consumer in consumers.values():
                    await wait_for(consumer.got_heartbeat, timeout=10)
                main = app[TAPS].process.pid
                (old,) = shard_pids(main)

                async def hang(i: int) -> None:
                    async with s.post(
                        url + "/v1/chat/completions", json=chat(f"h{i}"), headers={HANG_HEADER: "1"}
                    ) as r:
                        await r.read()

                streams = [asyncio.create_task(hang(i)) for i in range(3)]
                await wait_for(lambda: consumers["kv"].has(3), timeout=20)
                await wait_for(
                    lambda: (
                        sample(registry, "shadow_worker_shard_restarts_total", reason="recycled")
                        == 1
                    ),
                    timeout=10,
                )
                await wait_for(lambda: len(shard_pids(main)) == 2, timeout=10)
                await wait_for(lambda: sample(registry, "shadow_worker_processes") == 2, START_S)
                for i in range(4):  # to the new shard
                    async with s.post(url + "/v1/chat/completions", json=chat(f"n{i}")) as r:
                        await r.read()
                await wait_for(lambda: consumers["replay"].has(4), timeout=20)
                assert Path(f"/proc/{old}").exists()  # still has its three streams
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                await wait_for(lambda: not Path(f"/proc/{old}").exists(), timeout=20)
                await wait_for(lambda: consumers["replay"].has(7), timeout=10)
                outcomes = sorted(r["response"]["outcome"] for r in consumers["replay"].records)
                assert outcomes == ["cancelled"] * 3 + ["complete"] * 4
                assert consumers["kv"].has(7)

                def settled(name: str) -> bool:
                    """A heartbeat and a relayed snapshot that count all seven."""
                    consumer = consumers[name]
                    consumer.poll()
                    beats = consumer.heartbeats
                    published = sample(registry, "shadow_tap_published_total", tap=name)
                    return bool(beats) and beats[-1][1].next_seq >= 7 and published == 7

                await wait_for(lambda: settled("kv") and settled("replay"), timeout=10)
                for name in ("kv", "replay"):
                    summary = consumers[name].summary()
                    assert summary["tap_gaps"] + summary["tail_loss"] == 0
                    for reason in ("worker_died", "closed", "handoff_full"):
                        dropped = sample(
                            registry, "shadow_tap_dropped_total", tap=name, reason=reason
                        )
                        assert dropped == 0
                assert shard_pids(main) and old not in shard_pids(main)
                assert (
                    sample(registry, "shadow_worker_shard_restarts_total", reason="recycled") == 1
                )
