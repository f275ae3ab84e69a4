"""The tools extra: a missing package is one line naming it and the install command."""

from __future__ import annotations

from shadow_proxy.extras import TOOLS, missing_tools


def test_everything_installed_here() -> None:
    assert missing_tools() is None  # the dev extra includes the tools extra


def test_the_first_missing_module_is_named() -> None:
    message = missing_tools(("json", "no_such_module_here", "also_missing"))
    assert message == (
        "needs no_such_module_here: install the tools extra (pip install 'shadow-proxy[tools]')"
    )


def test_the_tools_are_the_extra() -> None:
    assert TOOLS == ("numpy", "numba", "xxhash", "matplotlib", "pyarrow")
