"""An event loop on fake time, for tests of pacing that need no I/O (``run``).

Its clock starts at 0 and moves only when the loop would wait: where a real
loop would block in ``select`` for the next timer, this one moves its clock to
that timer and goes on. A ``sleep(0.2)`` takes no wall time and the loop's
``time()`` reads exactly 0.2 more after it, whatever the host's load, so a test
can assert on times exactly. Code under test reads the clock through
``loop_ns`` (or ``loop.time()``), not ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """Waits for nothing: a wait for the next timer moves the loop's clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: FakeTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout and self.loop is not None:
            self.loop.now += timeout
        return ready


class FakeTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end on a new ``FakeTimeLoop``."""
    loop = FakeTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def loop_ns() -> int:
    """The running loop's time in ns (a ``clock=`` for the code under test)."""
    return round(asyncio.get_running_loop().time() * 1e9)


def on_fake_time(test: Any) -> Any:
    """An ``async def`` test run on a new ``FakeTimeLoop`` (a plain test to
    pytest, not pytest-asyncio's)."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run(test(*args, **kwargs))

    return wrapper
