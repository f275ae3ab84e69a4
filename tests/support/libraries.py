"""Shared libraries the tests load or preload, found on the machine that runs them."""

from __future__ import annotations

import os
from pathlib import Path


def mapped_files(pid: int | str = "self") -> list[str]:
    """The paths of the files mapped in a process (``/proc/<pid>/maps``)."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6:
            out.append(fields[5])
    return out


def glibc_malloc_debug() -> str:
    """glibc's own preloadable malloc (beside libc.so.6 since glibc 2.34): a malloc
    library every machine that runs these tests has, so the preloading itself is
    tested everywhere (jemalloc and mimalloc, ``auto``'s choices, are the image's)."""
    for path in mapped_files():
        if os.path.basename(path).startswith("libc.so"):
            return os.path.join(os.path.dirname(path), "libc_malloc_debug.so.0")
    raise AssertionError("libc.so is not mapped")
