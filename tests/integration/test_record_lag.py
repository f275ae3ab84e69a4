"""Record lag you can see and bound (issue 19): a worker that falls behind past
worker.max_lag_s gives requests up (late, counted, seen as gaps) instead of
publishing them late; what it publishes stays under the bound; clients never wait."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest
import zmq

from shadow_proxy.devtools.processes import wait_until as wait_for
from shadow_proxy.serving.supervisor import TAPS
from tests.integration.workers import (
    Consumer,
    chat,
    close_consumers,
    plain_frontend,
    sample,
    shard_pids,
    tap,
)
from tests.support.servers import proxy_config, run_proxy, serve

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    close_consumers()
    context.term()


class TestStalledWorker:
    """The worker stopped for longer than max_lag_s while requests arrive."""

    async def test_late_requests_counted_published_ones_within_bound(self, model_dirs, context):
        async with serve(plain_frontend()) as frontend:
            config = proxy_config(
                frontend,
                models=[{"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])}],
                taps=[tap("kv")],
                worker={"processes": 1, "max_lag_s": 1.0},
            )
            async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
                consumer = Consumer(context, config.taps[0].endpoint, config.taps[0].topic)
                await wait_for(consumer.got_heartbeat, timeout=10)
                main = app[TAPS].process.pid
                pids = [main, *shard_pids(main)]

                async def request(i: int) -> float:
                    started = time.monotonic()
                    async with s.post(url + "/v1/chat/completions", json=chat(f"q {i}")) as r:
                        assert r.status == 200
                        await r.read()
                    return time.monotonic() - started

                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    waits = [await request(i) for i in range(6)]
                    await asyncio.sleep(2.0)  # now they are older than max_lag_s
                finally:
                    for pid in pids:
                        os.kill(pid, signal.SIGCONT)
                assert max(waits) < 0.5, waits  # the clients never waited for the worker
                for i in range(4):
                    await request(10 + i)

                def late() -> float:
                    return sample(registry, "shadow_tap_dropped_total", tap="kv", reason="late")

                def lost() -> int:
                    summary = consumer.summary()  # tail loss: once a heartbeat says so
                    return summary["tap_gaps"] + summary["tail_loss"]

                def lag_count() -> float:
                    return sample(registry, "shadow_tap_record_lag_seconds_count", tap="kv")

                # The records, the drops, a heartbeat and the relayed metrics that count them.
                await wait_for(
                    lambda: consumer.has(4) and late() == 6 and lost() == 6 and lag_count() == 4,
                    timeout=10,
                )
                assert len(consumer.records) == 4
                assert sample(registry, "shadow_worker_late_total", stage="intake") == 6
                # What was published was published within the bound.
                within = sample(
                    registry, "shadow_tap_record_lag_seconds_bucket", tap="kv", le="1.0"
                )
                assert within == 4
