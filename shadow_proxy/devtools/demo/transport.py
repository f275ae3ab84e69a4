"""How a demo run's taps reach their consumers: ZeroMQ (the default) or JetStream.

``zmq_taps`` and ``nats_taps`` run once per run, before anything starts: they
give the run's ``RunTaps``, the reference taps as the proxy's configuration
holds them, the configuration's extra top-level keys and each consumer's
source arguments.

- ZeroMQ: each tap binds its own loopback endpoint; the consumers start first
  and subscribe (ZeroMQ reconnects until the proxy binds), and the load waits
  until each consumer has seen its tap's heartbeat, so no record is sent before
  the subscriptions are in place.
- JetStream (``--transport nats``): one nats-server for the whole demo
  (``demo_nats_server``, started and stopped by the demo), a stream per run
  (``DEMO_<n>``, 1 GiB) that the proxy creates at start-up; each tap has
  ``transport: nats`` and no endpoint; each consumer reads its tap with a
  durable (``demo-<tap>``) once the stream exists (``wait_for_stream``): a
  durable reads the stream from its start, so nothing can be missed. The
  run's stream is deleted when the run ends (``delete_stream``): every stream
  the proxy creates takes the subjects ``shadow.>``, and two streams may not
  share subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.devtools.reference_taps import reference_taps

TRANSPORTS = ("zmq", "nats")
#: Each run's stream holds at most this much (a run writes a few MB).
STREAM_MAX_BYTES = 2**30
CONNECT_TIMEOUT_S = 5.0


@attrs.frozen
class RunTaps:
    """One run's taps: as configured, the extra configuration, the consumers' sources."""

    transport: str
    taps: list[dict[str, Any]]
    config: dict[str, Any]
    #: Tap name -> the consumer's source arguments.
    sources: dict[str, list[str]]
    #: JetStream: the run's stream and the servers.
    stream: str | None = None
    servers: tuple[str, ...] = ()

    @property
    def consumers_first(self) -> bool:
        """ZeroMQ consumers subscribe before the proxy starts; JetStream ones
        start once the proxy has made the stream."""
        return self.transport == "zmq"


def zmq_taps() -> RunTaps:
    """The reference taps on fresh loopback endpoints."""
    taps = reference_taps([reserve_endpoint() for _ in range(2)])
    sources = {t["name"]: ["--endpoint", t["endpoint"], "--topic", t["topic"]] for t in taps}
    return RunTaps("zmq", taps, {}, sources)


def stream_name(number: int) -> str:
    """The stream of run ``number``."""
    return f"DEMO_{number}"


def nats_taps(servers: Sequence[str], number: int) -> RunTaps:
    """The reference taps published to JetStream, in run ``number``'s stream."""
    stream = stream_name(number)
    taps = reference_taps()
    for tap in taps:
        tap["transport"] = "nats"
    config = {"nats": {"servers": list(servers), "stream": stream, "max_bytes": STREAM_MAX_BYTES}}
    sources = {}
    for tap in taps:
        sources[tap["name"]] = [
            *(arg for url in servers for arg in ("--nats", url)),
            "--stream",
            stream,
            "--tap",
            tap["name"],
            "--topic",
            tap["topic"],
            "--durable",
            f"demo-{tap['name']}",
        ]
    return RunTaps("nats", taps, config, sources, stream=stream, servers=tuple(servers))


@contextlib.contextmanager
def demo_nats_server(directory: Path, statuses: dict[str, int]) -> Iterator[list[str]]:
    """A nats-server with JetStream on loopback for the whole demo; yields its
    URLs. On the way out it is stopped (SIGTERM) and its exit status goes to
    ``statuses["nats-server"]``."""
    from shadow_proxy.devtools.nats_server import NatsCluster

    cluster = NatsCluster.create(directory, size=1, name="demo-nats")
    try:
        cluster.start()
        yield cluster.urls
    finally:
        cluster.stop()
        process = cluster.servers[0].process
        if process is not None:
            statuses["nats-server"] = process.returncode


async def _quiet(_error: Exception) -> None:
    """nats-py logs every failed attempt unless given an error callback."""


async def _connect(servers: Sequence[str]) -> Any:
    """One connection attempt per server, no reconnection (the demo's own look-ups)."""
    import nats

    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        return await nats.connect(
            servers=list(servers),
            connect_timeout=2,
            allow_reconnect=False,
            error_cb=_quiet,
        )


async def stream_exists(servers: Sequence[str], stream: str) -> bool:
    """Whether ``stream`` exists (False while no server answers)."""
    import nats
    import nats.errors
    import nats.js.errors

    try:
        nc = await _connect(servers)
    except (OSError, TimeoutError, nats.errors.Error):
        return False
    try:
        await nc.jetstream().stream_info(stream)
    except (nats.js.errors.NotFoundError, nats.errors.Error, TimeoutError):
        return False
    finally:
        await nc.close()
    return True


async def delete_stream(servers: Sequence[str], stream: str) -> None:
    """Delete ``stream`` (a run's stream, once its consumers have stopped)."""
    nc = await _connect(servers)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()
