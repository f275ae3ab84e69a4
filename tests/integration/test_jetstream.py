"""JetStream taps end to end (issue 12): the real proxy and tap worker, the
built-in frontend, real clients, real nats-servers; the stream read back both
directly and through ``shadow-consumer --nats``.

- the reference runs give the same totals, and the same records byte for
  byte apart from ``tap`` and ``seq``, through JetStream as through ZeroMQ;
- a three-server cluster, stream replicas 3, loses its stream leader to
  SIGKILL in the middle of a run and gets it back: clients see no error and
  every record is in the stream exactly once;
- every server stopped (SIGSTOP, then SIGKILL) during load: clients are
  unaffected, the worker's memory stays within the bound, drops are counted,
  publishing resumes when the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import nats
import pytest

from shadow_proxy.consumer.accounting import Accounts
from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.loadgen import LoadSpec, run_load
from shadow_proxy.devtools.nats_server import NatsCluster
from shadow_proxy.devtools.processes import reserve_port, wait_until
from shadow_proxy.serving.app import TAPS
from shadow_proxy.serving.supervisor import StartupError
from shadow_proxy.worker.main.publishers.jetstream import PENDING_BYTES
from shadow_proxy.worker.main.publishers.jetstream_metrics import MISMATCHES, NO_ANSWERS
from tests.integration.jetstream_helpers import (
    REFERENCE_TAPS,
    consumer_cli,
    jetstream_config,
    on_nats,
)
from tests.support.jetstream import MODEL, envelopes, tap_messages
from tests.support.nats import stream_info
from tests.support.servers import run_proxy, serve
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.nats, pytest.mark.solo, pytest.mark.timeout(120)]

#: Worker start-up (spawn, import, load the tokenizer) on a busy machine.
SETTLE_S = 30.0
SUMMARY_KEYS = ("records", "responses", "prompt_tokens", "output_tokens", "outcomes")


@contextlib.asynccontextmanager
async def frontend(model_dirs: dict[str, Path], itl_ms: float):
    config = MockConfig(models={MODEL: model_dirs[MODEL]}, ttft_ms=5.0, itl_ms=itl_ms)
    async with serve(mock_app(config)) as url:
        yield url


def tap_state(app: Any) -> dict[str, dict[str, Any]]:
    """The worker's latest per-tap counters (relayed every second)."""
    return {t["name"]: t for t in app[TAPS].listing() if "published" in t}


async def published(app: Any, tap: str, count: int, timeout: float = SETTLE_S) -> None:
    await wait_until(lambda: tap_state(app).get(tap, {}).get("published") == count, timeout)


def accounts_of(subscriber: TapSubscriber) -> Accounts:
    """The consumer's accounting of what the test subscriber received (its first
    heartbeat came before any record: the test waits for it before sending)."""
    accounts = Accounts(subscriber.topic)
    received = subscriber.received()
    for message, heartbeat in received.heartbeats:
        accounts.on_heartbeat(message, heartbeat, 0.0)
    for message, envelope in zip(received.messages, received.records, strict=True):
        accounts.on_record(message, envelope)
    return accounts


def problems(registry: Any, reasons: tuple[str, ...]) -> float | None:
    """The stream problems counted for ``reasons`` (None before the worker's
    JetStream metrics reach the registry)."""
    values = [
        registry.get_sample_value("shadow_nats_stream_problems_total", {"reason": r})
        for r in reasons
    ]
    return None if None in values else sum(values)


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary[key] for key in SUMMARY_KEYS}


class TestSameAsZeroMQ:
    """One proxy, the reference taps twice: on ZeroMQ and on JetStream. The three
    reference runs (streaming, not streaming, 25% cancelled) give equal totals."""

    async def test_reference_runs(self, nats_server, model_dirs, subscribe):
        zmq_taps = [{**t, "endpoint": f"tcp://127.0.0.1:{reserve_port()}"} for t in REFERENCE_TAPS]
        nats_taps = [on_nats(t, "-js") for t in REFERENCE_TAPS]
        readers: dict[str, TapSubscriber] = {}
        sent = 0
        async with frontend(model_dirs, itl_ms=2.0) as url_frontend:
            config = jetstream_config(
                url_frontend, model_dirs, nats_server.urls, *zmq_taps, *nats_taps
            )
            async with run_proxy(config) as (url, _, app):
                for tap in zmq_taps:
                    readers[tap["name"]] = subscribe(tap["endpoint"], tap["topic"])
                for reader in readers.values():
                    await reader.wait_heartbeats()
                for stream, cancel in ((True, 0.0), (False, 0.0), (True, 0.25)):
                    spec = LoadSpec(
                        url=url,
                        model=MODEL,
                        requests=30,
                        concurrency=6,
                        prompt_tokens=96,
                        output_tokens=8,
                        stream=stream,
                        cancel_fraction=cancel,
                    )
                    report = await run_load(spec)
                    assert report.summary()["errors"] == 0
                    sent += len(report.results)
                for tap in nats_taps:
                    await published(app, tap["name"], sent)
                for reader in readers.values():
                    await reader.wait_records(sent, SETTLE_S)

        for zmq_tap, nats_tap in zip(zmq_taps, nats_taps, strict=True):
            over_zmq = accounts_of(readers[zmq_tap["name"]]).summary(0.0)
            over_nats = await consumer_cli(
                "--nats",
                nats_server.urls[0],
                "--tap",
                nats_tap["name"],
                "--topic",
                nats_tap["topic"],
                "--durable",
                f"equal-{nats_tap['name']}",
                "--max-records",
                str(sent),
                "--duration",
                "30",
            )
            assert over_nats["records"] == sent
            assert comparable(over_nats) == comparable(over_zmq)
            for summary in (over_nats, over_zmq):
                assert summary["tap_gaps"] == summary["duplicates"] == 0
                assert summary["undecodable"] == {}
            # The same envelopes, byte for byte once tap and seq are set aside.
            stored = envelopes(await tap_messages(nats_server.urls, f"shadow.{nats_tap['topic']}"))
            live = readers[zmq_tap["name"]].received().records
            by_id = {e["request_id"]: e for e in live}
            assert len(stored) == len(by_id) == sent
            for envelope in stored:
                twin = by_id[envelope["request_id"]]
                assert {**envelope, "tap": None, "seq": None} == {**twin, "tap": None, "seq": None}


class TestClusterFailover:
    """Stream replicas 3; the stream leader is SIGKILLed mid-run and restarted."""

    async def test_leader_killed_and_restarted(self, nats_cluster, model_dirs):
        taps = [on_nats(t) for t in REFERENCE_TAPS]
        requests = 150
        async with frontend(model_dirs, itl_ms=8.0) as url_frontend:
            config = jetstream_config(
                url_frontend, model_dirs, nats_cluster.urls, *taps, replicas=3
            )
            async with run_proxy(config) as (url, registry, app):
                spec = LoadSpec(
                    url=url,
                    model=MODEL,
                    requests=requests,
                    concurrency=8,
                    prompt_tokens=64,
                    output_tokens=24,
                )
                load = asyncio.create_task(run_load(spec))
                await wait_until(lambda: tap_state(app)["kv"]["published"] >= 25, SETTLE_S)
                info = await stream_info(nats_cluster.urls, "SHADOW")
                assert info.config.num_replicas == 3
                leader = next(s for s in nats_cluster.servers if s.name == info.cluster.leader)
                leader.kill()
                await asyncio.sleep(2.0)
                assert not load.done(), "the run ended before the leader came back"
                leader.start()
                report = await load
                summary = report.summary()
                assert (summary["ok"], summary["errors"]) == (requests, 0)
                for tap in taps:
                    await published(app, tap["name"], requests, timeout=60)
                state = tap_state(app)
                # A failover is a transient no-answer, never a mismatch (that pages).
                await wait_until(lambda: problems(registry, NO_ANSWERS) is not None, SETTLE_S)
                assert problems(registry, MISMATCHES) == 0
                transient = problems(registry, NO_ANSWERS)
        leader.wait_healthy()
        print(f"no-answers counted during the failover: {transient}")
        for tap in taps:
            assert not any(state[tap["name"]]["dropped"].values()), state[tap["name"]]
            messages = await tap_messages(nats_cluster.urls, f"shadow.{tap['topic']}")
            seqs = sorted(int(m.headers["Shadow-Seq"]) for m in messages)
            assert seqs == list(range(requests)), "every record exactly once"
            totals = await consumer_cli(
                "--nats",
                nats_cluster.urls[1],
                "--tap",
                tap["name"],
                "--topic",
                tap["topic"],
                "--durable",
                f"failover-{tap['name']}",
                "--max-records",
                str(requests),
                "--duration",
                "30",
            )
            assert totals["records"] == requests
            assert totals["duplicates"] == totals["tap_gaps"] == 0
            if tap["capture"] == "request":
                assert totals["prompt_tokens"] == summary["prompt_tokens"]
            else:
                assert totals["output_tokens"] == summary["completion_tokens"]
                assert totals["outcomes"] == {"complete": requests}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class TestServersStopped:
    """SIGSTOP, then SIGKILL, of every server under load: the clients do not notice,
    the tap drops (counted ``full``) once its queue and window are full, the worker
    stays within its memory bound, and publishing resumes with the server."""

    async def test_outage(self, nats_server, model_dirs):
        capacity = 32
        tap = on_nats(REFERENCE_TAPS[0], capacity=capacity)
        server = nats_server.servers[0]

        async def load(url: str, requests: int) -> dict[str, Any]:
            spec = LoadSpec(
                url=url,
                model=MODEL,
                requests=requests,
                concurrency=8,
                prompt_tokens=64,
                output_tokens=8,
            )
            summary = (await run_load(spec)).summary()
            assert (summary["ok"], summary["errors"]) == (requests, 0)
            return summary

        async with frontend(model_dirs, itl_ms=2.0) as url_frontend:
            config = jetstream_config(url_frontend, model_dirs, nats_server.urls, tap)
            async with run_proxy(config) as (url, registry, app):
                worker = app[TAPS].process.pid
                before = await load(url, 40)
                await published(app, "kv", 40)
                rss_before = rss_bytes(worker)

                server.pause()
                during = await load(url, 100)
                await wait_until(
                    lambda: tap_state(app)["kv"]["dropped"]["full"] == 100 - 2 * capacity, SETTLE_S
                )
                server.kill()
                await load(url, 20)
                await wait_until(
                    lambda: tap_state(app)["kv"]["dropped"]["full"] == 120 - 2 * capacity, SETTLE_S
                )
                assert (
                    registry.get_sample_value("shadow_tap_awaiting_ack", {"tap": "kv"}) == capacity
                )
                grown = rss_bytes(worker) - rss_before
                # The bound: queue and window (2 x capacity records of about 1 KiB here)
                # plus nats-py's outgoing buffer; 16 MiB for the allocator's slack.
                assert grown < PENDING_BYTES + 2 * capacity * 4096 + 16 * 2**20, grown
                # The clients did not notice (generous: the machine is shared).
                assert during["e2e_p99_ms"] < 3 * before["e2e_p99_ms"] + 250

                server.start()
                server.wait_healthy()
                await published(app, "kv", 40 + 2 * capacity, timeout=30)
                await load(url, 10)
                await published(app, "kv", 50 + 2 * capacity)
                state = tap_state(app)["kv"]
        assert state["next_seq"] == 170
        assert state["dropped"]["full"] == 120 - 2 * capacity
        messages = await tap_messages(nats_server.urls, "shadow.kv")
        seqs = [int(m.headers["Shadow-Seq"]) for m in messages]
        assert len(seqs) == len(set(seqs)) == 50 + 2 * capacity


class TestStartUp:
    """The proxy starts and serves when no NATS server answers, and publishes once
    one does; a stream that does not cover the taps' subjects stops start-up."""

    async def test_no_server_then_one(self, tmp_path, model_dirs):
        cluster = NatsCluster.create(tmp_path / "nats", 1)
        tap = on_nats(REFERENCE_TAPS[0])
        try:
            async with frontend(model_dirs, itl_ms=1.0) as url_frontend:
                config = jetstream_config(url_frontend, model_dirs, cluster.urls, tap)
                async with run_proxy(config) as (url, registry, app):
                    spec = LoadSpec(
                        url=url,
                        model=MODEL,
                        requests=10,
                        concurrency=4,
                        prompt_tokens=32,
                        output_tokens=4,
                    )
                    summary = (await run_load(spec)).summary()
                    assert (summary["ok"], summary["errors"]) == (10, 0)
                    await wait_until(lambda: tap_state(app).get("kv", {}).get("queued") == 10, 10)
                    assert tap_state(app)["kv"]["published"] == 0
                    cluster.start()
                    await published(app, "kv", 10)
            messages = await tap_messages(cluster.urls, "shadow.kv")
            assert sorted(int(m.headers["Shadow-Seq"]) for m in messages) == list(range(10))
        finally:
            cluster.stop()

    async def test_stream_not_covering_the_taps(self, nats_server, model_dirs):
        nc = await nats.connect(nats_server.urls)
        await nc.jetstream().add_stream(name="SHADOW", subjects=["elsewhere.>"])
        await nc.close()
        tap = on_nats(REFERENCE_TAPS[0])
        async with frontend(model_dirs, itl_ms=1.0) as url_frontend:
            config = jetstream_config(url_frontend, model_dirs, nats_server.urls, tap)
            with pytest.raises(StartupError) as info:
                async with run_proxy(config):
                    pass
        message = str(info.value)
        for part in ("'SHADOW'", "elsewhere.>", "shadow.kv"):
            assert part in message, message
