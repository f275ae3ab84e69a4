"""The tap worker's memory allocator (``worker.malloc``): jemalloc, else mimalloc,
preloaded in the worker's processes when the machine has one.

Why. A shard's work is a stream of short-lived allocations of every size:
Python's objects over 512 bytes, and the tokenizer's strings and vectors (Rust,
through the C library's malloc). On the multi-turn bench, perf put glibc's
malloc and free at about a quarter of a shard's CPU (``_int_malloc`` alone 11%,
then ``_int_free``, ``malloc_consolidate``, ``unlink_chunk``); with jemalloc
the worker spent ~13% less a request, and glibc's own tunables (trim and mmap
thresholds, top pad) did not move it (docs/benchmarks.md, issue 34's seventh
round).

How. The serving process starts the worker's main with ``LD_PRELOAD`` naming
the library ahead of what the environment already preloads (``worker_env``);
the shards inherit it. The serving process keeps the C library's malloc: its
costs are measured as they are. Each shard says what it runs on (``in_use``:
the library mapped in its address space, else ``system``), counted in
``shadow_worker_malloc_processes{library}``; a library the loader could not
preload shows there as ``system`` (the loader says why on stderr).
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable, Mapping

AUTO = "auto"
SYSTEM = "system"
#: Names the preloaded library for the worker's processes (``in_use``).
ENV = "SHADOW_PROXY_MALLOC"
#: What ``auto`` looks for, in order: (the name ``find_library`` takes, its file).
CANDIDATES = (("jemalloc", "libjemalloc.so.2"), ("mimalloc", "libmimalloc.so.2"))


def choose(setting: str, find: Callable[[str], str | None] = ctypes.util.find_library) -> str:
    """The library ``worker.malloc`` names (a path, or a file name the loader
    finds), or ``SYSTEM``. ``auto``: the first of ``CANDIDATES`` the loader's
    cache knows (``find``), else ``SYSTEM``."""
    if setting != AUTO:
        return setting
    for name, file in CANDIDATES:
        if find(name) == file:
            return file
    return SYSTEM


def worker_env(library: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment the worker's main starts with: ``environ`` with
    ``library`` preloaded ahead of what it preloads, and named in ``ENV`` for
    ``in_use`` (``SYSTEM``: nothing preloaded)."""
    env = {**environ, ENV: library}
    if library != SYSTEM:
        before = environ.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{library}:{before}" if before else library
    return env


def in_use(maps_path: str = "/proc/self/maps") -> str:
    """The allocator this process runs on: the file name of the library
    ``worker_env`` preloaded when it is mapped in the address space, else
    ``SYSTEM``."""
    library = os.environ.get(ENV, SYSTEM)
    if library == SYSTEM:
        return SYSTEM
    name = os.path.basename(library)
    try:
        with open(maps_path) as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].rstrip("\n")) == name:
                    return name
    except OSError:
        pass
    return SYSTEM
