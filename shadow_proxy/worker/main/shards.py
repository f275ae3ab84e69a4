"""The shards of the tap worker as records of its main (``worker/main/pool.py``): one
shard's process, socket and pending output; an open request; how a shard is
spawned (``lifeline.spawn``: it dies with the main), how its output is written
without blocking; the pool's own metrics.
"""

from __future__ import annotations

import enum
import os
import socket
import subprocess
import time
import zlib
from pathlib import Path

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from shadow_proxy import lifeline
from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.channel.stream import StreamDecoder, consume, stream_message
from shadow_proxy.config import Config
from shadow_proxy.worker import messages

_IOV_MAX = 512


def default_processes() -> int:
    """One shard per core the sidecar is given: the CPU affinity, capped by the
    cgroup's CPU quota (``cpu.max``) when there is one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


class RestartReason(enum.StrEnum):
    """Why a shard was started again (``shadow_worker_shard_restarts_total{reason}``)."""

    #: A crash or a kill.
    DIED = "died"
    #: Over ``worker.max_rss_mb``, replaced between requests.
    RECYCLED = "recycled"


@attrs.define(eq=False)
class Shard:
    index: int
    token: int
    process: subprocess.Popen
    started: float
    sock: socket.socket | None = None
    decoder: StreamDecoder = attrs.field(factory=StreamDecoder)
    out: list[bytes] = attrs.field(factory=list)
    out_bytes: int = 0
    ready: bool = False
    #: Takes no new request; exits once its open requests are done.
    retiring: bool = False
    drain_deadline: float = 0.0
    exit_sent: bool = False
    keys: set[bytes] = attrs.field(factory=set)
    #: What it said when ready (its scheduling class).
    info: messages.Ready | None = None
    #: It was started to replace a recycled shard.
    replaces: bool = False

    def queue(self, message: bytes) -> None:
        """A stream message for the shard; written by ``write_out``."""
        self.out.append(message)
        self.out_bytes += len(message)

    def send_exit(self) -> None:
        """Once: finish what you were sent and exit."""
        if not self.exit_sent:
            self.exit_sent = True
            self.queue(stream_message(messages.Exit().encode()))


@attrs.define(eq=False)
class OpenRequest:
    shard: Shard
    #: Records the request still owes, per tap index (before the shard's first
    #: settle: one on every tap). The shard may keep a request that owes none, for
    #: the prompt-token check at its end.
    waiting: dict[int, int]
    #: A message of it could not be forwarded: its end goes as a lost capture.
    lost: bool = False


def shard_key(key: bytes, headers: bytes | None) -> int:
    """What picks a request's shard: a hash of its conversation id
    (``channel.headers.conversation``, read from its engine headers frame), else
    its key."""
    session = engine_headers.conversation(headers) if headers else None
    if session is None:
        return int.from_bytes(key, "big")
    return zlib.crc32(session)


#: A shard's life, named by its import path (the main never loads the models).
SHARD_RUN = ("shadow_proxy.worker.shard.loop", "run")


def spawn_shard(config: Config, path: str, processes: int, index: int, token: int) -> Shard:
    """Start a shard (``worker/shard/loop.py``). One Rust thread for the tokenizer:
    N shards on N cores, not N x N threads."""
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = lifeline.spawn(SHARD_RUN, (config, token, path, processes), env=env)
    return Shard(index, token, process, time.monotonic())


def write_out(shard: Shard) -> None:
    """Write what the shard's pipe takes now; keep the rest (never blocks)."""
    sock = shard.sock
    while shard.out and sock is not None:
        try:
            sent = sock.sendmsg(shard.out[:_IOV_MAX])
        except BlockingIOError:
            return
        except OSError:
            return  # its end is gone: the read side sees the EOF
        shard.out_bytes -= sent
        consume(shard.out, sent)


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.restarts = Counter(
            "shadow_worker_shard_restarts",
            "Shards started again, by reason (died: a crash or a kill; recycled: over "
            "worker.max_rss_mb, replaced between requests).",
            ["reason"],
            registry=registry,
        )
        for reason in RestartReason:
            self.restarts.labels(reason)
        self.processes = Gauge(
            "shadow_worker_processes", "Tap worker processes (shards) running.", registry=registry
        )
        self.idle = Gauge(
            "shadow_worker_idle_processes",
            "Shards in the idle scheduling class (the others fell back to a nice level).",
            registry=registry,
        )
        self.malloc = Gauge(
            "shadow_worker_malloc_processes",
            "Shards by the allocator they run on (worker.malloc; system: the C library's).",
            ["library"],
            registry=registry,
        )
        #: The libraries labelled so far (a gauge that falls to 0 stays shown).
        self.seen_mallocs: set[str] = set()
