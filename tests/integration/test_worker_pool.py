"""The tap worker as a pool (issues 17 item 4, 19): shards share the work, the main
takes every seq; a shard or the main killed with streams in flight costs counted
records that consumers see as gaps, and /metrics never goes backwards."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
import zmq

from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.processes import wait_until as wait_for
from shadow_proxy.serving.supervisor import TAPS
from tests.integration.workers import (
    START_S,
    Consumer,
    chat,
    close_consumers,
    sample,
    shard_pids,
    tap,
    tap_counters,
)
from tests.support.libraries import glibc_malloc_debug, mapped_files
from tests.support.servers import proxy_config, run_proxy, serve

pytestmark = pytest.mark.timeout(240)

HANG = {"x-mock-fault": "hang"}


@pytest.fixture
async def frontend(model_dirs):
    async with serve(mock_app(MockConfig(models={"deepseek": model_dirs["deepseek"]}))) as url:
        yield url


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    close_consumers()
    context.term()


def config_for(frontend: str, model_dirs, *taps: dict, **worker):
    return proxy_config(
        frontend,
        models=[{"name": "deepseek", "tokenizer": str(model_dirs["deepseek"])}],
        taps=list(taps),
        worker={"processes": 2, **worker},
    )


async def consumers_of(config, context) -> dict[str, Consumer]:
    consumers = {t.name: Consumer(context, t.endpoint, t.topic) for t in config.taps}
    for consumer in consumers.values():
        await wait_for(consumer.got_heartbeat, timeout=10)
    return consumers


async def post(session: aiohttp.ClientSession, url: str, body: dict, headers=None) -> str:
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200
        await r.read()
        return r.headers["x-request-id"]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class TestShards:
    """Two shards share the requests; each record is published once, seqs contiguous."""

    async def test_exactly_once_across_shards(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"), tap("replay", "request_response"))
        async with run_proxy(config) as (url, registry, app):
            consumers = await consumers_of(config, context)
            shards = shard_pids(app[TAPS].process.pid)
            assert len(shards) == 2
            before = {pid: cpu_ticks(pid) for pid in shards}
            n = 48
            async with aiohttp.ClientSession() as s:
                sem = asyncio.Semaphore(8)

                async def one(i: int) -> str:
                    async with sem:
                        return await post(
                            s, url, chat("a longer prompt, about a page " * 40 + str(i))
                        )

                ids = await asyncio.gather(*(one(i) for i in range(n)))
            for consumer in consumers.values():
                await wait_for(lambda c=consumer: c.has(n), timeout=30)
                assert sorted(r["seq"] for r in consumer.records) == list(range(n))
                assert sorted(r["request_id"] for r in consumer.records) == sorted(ids)
                summary = consumer.summary()
                assert summary["tap_gaps"] == summary["tail_loss"] == 0
                assert len(summary["publishers"]) == 1
            used = {pid: cpu_ticks(pid) - before[pid] for pid in shards}
            assert all(ticks >= 0.2 * sum(used.values()) for ticks in used.values()), used
            await wait_for(lambda: sample(registry, "shadow_worker_processes") == 2)


async def hanging(session, url: str, n: int) -> list[asyncio.Task]:
    """``n`` streams the frontend never ends (until the client goes away)."""

    async def one(i: int) -> None:
        async with session.post(
            url + "/v1/chat/completions", json=chat(f"hanging {i}"), headers=HANG
        ) as r:
            await r.read()

    return [asyncio.create_task(one(i)) for i in range(n)]


async def cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class TestShardKilled:
    """SIGKILL of a shard with 10 streams in flight: its joined records are counted
    (worker_died, seqs taken) and consumers see them as gaps; it is started again."""

    async def test_sigkill_one_shard(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"), tap("replay", "request_response"))
        async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
            consumers = await consumers_of(config, context)
            kv, replay = consumers["kv"], consumers["replay"]
            for i in range(2):
                await post(s, url, chat(f"warm {i}"))
            tasks = await hanging(s, url, 10)
            await wait_for(lambda: kv.has(12), timeout=20)  # every request preprocessed
            victim = shard_pids(app[TAPS].process.pid)[0]
            os.kill(victim, signal.SIGKILL)

            def died(tap):
                return sample(
                    registry,
                    "shadow_tap_dropped_total",
                    tap=tap,
                    reason="worker_died",
                )

            await wait_for(lambda: died("replay") == 5, timeout=10)
            await cancel(tasks)  # the other shard's five end as cancelled records
            await wait_for(
                lambda: sample(registry, "shadow_worker_shard_restarts_total", reason="died") == 1
            )
            await wait_for(lambda: len(shard_pids(app[TAPS].process.pid)) == 2, timeout=START_S)
            await wait_for(lambda: sample(registry, "shadow_worker_processes") == 2, START_S)
            for i in range(4):
                await post(s, url, chat(f"after {i}"))

            def lost() -> int:
                summary = replay.summary()  # tail loss: once a heartbeat says so
                return summary["tap_gaps"] + summary["tail_loss"]

            await wait_for(lambda: replay.has(2 + 5 + 4) and kv.has(16) and lost() == 5, 20)
            assert died("kv") == 0 and died("replay") == 5
            assert replay.summary()["records"] == 11
            outcomes = [r["response"]["outcome"] for r in replay.records]
            assert outcomes.count("cancelled") == 5
            assert kv.summary()["tap_gaps"] == 0


class TestMainKilled:
    """SIGKILL of the worker's main with 10 streams in flight: its shards exit, it is
    started again; the new main announces the dead publisher's final state, so the
    consumer counts the 10 records as that publisher's tail loss, and /metrics, which
    counts them as worker_died, never goes backwards."""

    async def test_sigkill_main(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"), tap("replay", "request_response"))
        async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
            consumers = await consumers_of(config, context)
            kv, replay = consumers["kv"], consumers["replay"]
            for i in range(2):
                await post(s, url, chat(f"warm {i}"))
            tasks = await hanging(s, url, 10)
            await wait_for(lambda: kv.has(12) and replay.has(2), timeout=20)
            await wait_for(
                lambda: sample(registry, "shadow_tap_published_total", tap="kv") == 12, timeout=5
            )
            before = tap_counters(registry)
            old_main = app[TAPS].process.pid
            old_shards = shard_pids(old_main)
            old_publisher = replay.messages[0].publisher_id
            os.kill(old_main, signal.SIGKILL)
            await wait_for(
                lambda: app[TAPS].process.pid != old_main and app[TAPS].handoff.worker_alive,
                timeout=START_S,
            )
            for pid in old_shards:  # a shard dies with its main
                await wait_for(lambda p=pid: not Path(f"/proc/{p}").exists(), timeout=10)

            def final_heartbeat() -> int:
                replay.poll()
                beats = [
                    hb.next_seq for _, hb in replay.heartbeats if hb.publisher_id == old_publisher
                ]
                return max(beats, default=0)

            await wait_for(lambda: final_heartbeat() == 12, timeout=10)

            def died(tap):
                return sample(
                    registry,
                    "shadow_tap_dropped_total",
                    tap=tap,
                    reason="worker_died",
                )

            assert died("replay") == 10 and died("kv") == 0
            after = tap_counters(registry)
            for key, value in before.items():
                assert after.get(key, 0) >= value, key
            await cancel(tasks)
            old_ids = {old_publisher, kv.messages[0].publisher_id}
            for consumer in (kv, replay):  # reconnected to the new sockets (slow joiners)
                await wait_for(
                    lambda c=consumer: (
                        c.got_heartbeat() and {hb.publisher_id for _, hb in c.heartbeats} - old_ids
                    ),
                    timeout=10,
                )
            await post(s, url, chat("after"))
            await wait_for(lambda: replay.has(3) and kv.has(13), timeout=20)
            summary = replay.summary()
            (old,) = [p for p in summary["publishers"] if p["publisher_id"] == old_publisher]
            assert old["records"] == 2
            assert old["tap_gaps"] + old["tail_loss"] == 10
            assert summary["records"] == 3
            assert kv.summary()["tap_gaps"] + kv.summary()["tail_loss"] == 0


class TestIdleClass:
    """With worker.priority idle, every thread of every worker process is SCHED_IDLE."""

    @pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here")
    async def test_every_thread(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"), priority="idle")
        async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
            consumer = (await consumers_of(config, context))["kv"]
            await post(s, url, chat("wake the tokenizer threads"))
            await wait_for(lambda: consumer.has(1), timeout=20)
            main = app[TAPS].process.pid
            pids = [main, *shard_pids(main)]
            assert len(pids) == 3
            for pid in pids:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    assert os.sched_getscheduler(int(task.name)) == os.SCHED_IDLE, (pid, task)
            await wait_for(lambda: sample(registry, "shadow_worker_idle_processes") == 2)
            assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the serving process is not


class TestOomOrder:
    """Under memory pressure the kernel's OOM killer picks a shard (counted and started
    again) before the worker's main or the serving process."""

    async def test_shards_first(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"))
        async with run_proxy(config) as (url, registry, app):
            main = app[TAPS].process.pid

            def adj(pid: int | str) -> int:
                return int(Path(f"/proc/{pid}/oom_score_adj").read_text())

            shards = shard_pids(main)
            assert shards and all(adj(pid) == 500 for pid in shards)
            assert adj(main) < 500 and adj("self") < 500


def mapped(pid: int | str) -> set[str]:
    """The file names of the libraries mapped in a process."""
    return {os.path.basename(path) for path in mapped_files(pid)}


class TestMalloc:
    """worker.malloc: the library is preloaded in the worker's main and in every
    shard, never in the serving process, and the shards say so on /metrics."""

    async def test_preloaded_in_the_worker_only(self, frontend, model_dirs, context):
        library = glibc_malloc_debug()
        name = os.path.basename(library)
        config = config_for(frontend, model_dirs, tap("kv"), malloc=library)
        async with run_proxy(config) as (url, registry, app), aiohttp.ClientSession() as s:
            consumer = (await consumers_of(config, context))["kv"]
            await post(s, url, chat("a record through the preloaded allocator"))
            await wait_for(lambda: consumer.has(1), timeout=20)
            main = app[TAPS].process.pid
            shards = shard_pids(main)
            assert len(shards) == 2
            for pid in (main, *shards):
                assert name in mapped(pid), pid
            assert name not in mapped("self")
            await wait_for(
                lambda: sample(registry, "shadow_worker_malloc_processes", library=name) == 2
            )

    async def test_system(self, frontend, model_dirs, context):
        config = config_for(frontend, model_dirs, tap("kv"), malloc="system")
        async with run_proxy(config) as (url, registry, app):
            shards = shard_pids(app[TAPS].process.pid)
            assert len(shards) == 2
            ours = os.environ.get("LD_PRELOAD")
            for pid in shards:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                preload = [
                    v[len(b"LD_PRELOAD=") :].decode()
                    for v in environ
                    if v.startswith(b"LD_PRELOAD=")
                ]
                assert preload == ([ours] if ours else [])  # as the serving process has it
            await wait_for(
                lambda: sample(registry, "shadow_worker_malloc_processes", library="system") == 2
            )
