"""Optional dependencies: the offline tools' ``tools`` extra.

The sidecar's image carries only what serving and the taps need; ``shadow-trace``
and ``shadow-replay`` also need numpy, numba, xxhash, matplotlib and pyarrow
(``pip install 'shadow-proxy[tools]'``). Their command lines call
``missing_tools`` first, so a missing package is one clear line, not a traceback.
"""

from __future__ import annotations

import importlib.util

TOOLS = ("numpy", "numba", "xxhash", "matplotlib", "pyarrow")


def missing_tools(modules: tuple[str, ...] = TOOLS) -> str | None:
    """Why the tools extra cannot be used (the first missing module), or None."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            return f"needs {name}: install the tools extra (pip install 'shadow-proxy[tools]')"
    return None
