"""Shared libraries the tests load or preload, found on the machine that runs them."""

from __future__ import annotations

import os
from pathlib import Path


def glibc_malloc_debug() -> str:
    """glibc's own preloadable malloc (beside libc.so.6 since glibc 2.34): a malloc
    library every machine that runs these tests has, so the preloading itself is
    tested everywhere (jemalloc and mimalloc, ``auto``'s choices, are the image's)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5]).startswith("libc.so"):
            return os.path.join(os.path.dirname(fields[5]), "libc_malloc_debug.so.0")
    raise AssertionError("libc.so is not mapped")
