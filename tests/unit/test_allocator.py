"""The worker's allocator (``allocator.py``): what ``worker.malloc`` chooses, the
environment the worker starts with, and what a process reports it runs on."""

from __future__ import annotations

import os
import subprocess
import sys

from shadow_proxy import allocator
from tests.support.config_files import BASE, load, rejected
from tests.support.libraries import glibc_malloc_debug


def finder(*known: str):
    """A loader cache holding ``known`` (file names, as ``find_library`` gives them)."""

    def find(name: str) -> str | None:
        return next((f for f in known if f.startswith(f"lib{name}.so")), None)

    return find


class TestChoose:
    def test_auto_prefers_jemalloc_then_mimalloc(self) -> None:
        both = finder("libmimalloc.so.2", "libjemalloc.so.2")
        assert allocator.choose("auto", both) == "libjemalloc.so.2"
        assert allocator.choose("auto", finder("libmimalloc.so.2")) == "libmimalloc.so.2"

    def test_auto_without_either_is_the_system_malloc(self) -> None:
        assert allocator.choose("auto", finder()) == "system"
        # Another major version is another library: not what was measured.
        assert allocator.choose("auto", finder("libjemalloc.so.1")) == "system"

    def test_named(self) -> None:
        assert allocator.choose("system", finder("libjemalloc.so.2")) == "system"
        assert (
            allocator.choose("/opt/lib/libtcmalloc.so.4", finder()) == "/opt/lib/libtcmalloc.so.4"
        )


class TestWorkerEnv:
    def test_preloaded_first(self) -> None:
        env = allocator.worker_env("libjemalloc.so.2", {"LD_PRELOAD": "libfoo.so", "A": "1"})
        assert env["LD_PRELOAD"] == "libjemalloc.so.2:libfoo.so"
        assert env[allocator.ENV] == "libjemalloc.so.2"
        assert env["A"] == "1"

    def test_system_preloads_nothing(self) -> None:
        env = allocator.worker_env("system", {"LD_PRELOAD": "libfoo.so"})
        assert env["LD_PRELOAD"] == "libfoo.so"
        assert "LD_PRELOAD" not in allocator.worker_env("system", {})


def reported(env: dict[str, str]) -> str:
    """What ``in_use`` says in a new process started with ``env``."""
    code = "from shadow_proxy import allocator; print(allocator.in_use())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


class TestInUse:
    def test_a_preloaded_library(self) -> None:
        library = glibc_malloc_debug()
        assert reported(allocator.worker_env(library)) == os.path.basename(library)

    def test_named_but_not_preloaded(self) -> None:
        env = {**os.environ, allocator.ENV: glibc_malloc_debug()}
        env.pop("LD_PRELOAD", None)
        assert reported(env) == "system"

    def test_system(self) -> None:
        assert reported(allocator.worker_env("system")) == "system"


class TestConfig:
    def test_a_path_that_exists(self, tmp_path) -> None:
        library = glibc_malloc_debug()
        config = load(tmp_path, BASE + f"worker:\n  malloc: {library}\n")
        assert config.worker.malloc == library

    def test_refused(self, tmp_path) -> None:
        message = rejected(tmp_path, BASE + "worker:\n  malloc: libjemalloc.so.2\n")
        assert "absolute path" in message and "'worker.malloc'" in message
        message = rejected(tmp_path, BASE + f"worker:\n  malloc: {tmp_path}/none.so\n")
        assert "no such file" in message
