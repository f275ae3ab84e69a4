"""The judge process: the window's verdicts computed in a child that ends with
the service, counted and started again when it dies."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shadow_proxy.replay.judging import JudgeFailed, JudgeProcess
from shadow_proxy.replay.window import Snapshot
from tests.unit.replay.test_window import pair, window


def same(a: Snapshot, b: Snapshot) -> bool:
    def flat(s: Snapshot) -> list[object]:
        values = [s.pairs, *s.verdicts.items(), *s.reasons.items(), *s.exact_match.items()]
        values += [(k, v) for k, r in s.ratios.items() for v in r]
        return ["nan" if isinstance(v, float) and math.isnan(v) else v for v in values]

    return flat(a) == flat(b)


class Said:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.crashes = 0

    def say(self, line: str) -> None:
        self.lines.append(line)

    def crash(self) -> None:
        self.crashes += 1


async def test_same_verdicts_as_in_process() -> None:
    w = window()
    pairs = [pair(0, 500.0 + k, 100.0, k) for k in range(40)]
    prepared = w.prepare(pairs)
    said = Said()
    judge = JudgeProcess(said.say, said.crash)
    try:
        snapshot = prepared.snapshot(await judge.judge(prepared.request))
    finally:
        await judge.aclose()
    assert snapshot.verdicts["ttft"] == 1.0
    assert same(snapshot, w.judge(pairs))
    assert said.lines == [] and said.crashes == 0


async def test_a_crash_is_counted_said_once_and_restarted() -> None:
    w = window()
    request = w.prepare([pair(0, 500.0, 100.0, k) for k in range(30)]).request
    said = Said()
    judge = JudgeProcess(said.say, said.crash)
    try:
        first = await judge.judge(request)
        for crash in (1, 2):
            assert judge.pid is not None
            os.kill(judge.pid, signal.SIGKILL)
            with pytest.raises(JudgeFailed):
                await judge.judge(request)
            assert said.crashes == crash == judge.crashes
            assert await judge.judge(request) == first  # started again
        assert len(said.lines) == 1 and "exit status -9" in said.lines[0]
    finally:
        await judge.aclose()


PARENT = textwrap.dedent(
    """
    import asyncio, os, time
    from shadow_proxy.replay.judging import JudgeProcess
    from tests.unit.replay.test_window import pair, window

    async def main():
        judge = JudgeProcess(print, lambda: None)
        await judge.judge(window().prepare([pair(0, 100.0, 100.0, k) for k in range(30)]).request)
        holder = os.fork()
        if holder == 0:  # keeps the socket (and the pipes) open after the parent is gone
            time.sleep(600)
            os._exit(0)
        print(judge.pid, holder, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_dies_with_its_parent() -> None:
    """A SIGKILL of the service (which runs no cleanup) ends the judge, even
    while its socket is still open elsewhere (it may be judging: the end of the
    socket would be seen only after)."""
    holder = None
    with subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            assert parent.stdout is not None
            child, holder = map(int, parent.stdout.readline().split())
            assert not gone(child)
        finally:
            parent.kill()
    try:
        deadline = time.monotonic() + 30
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child)
    finally:
        if holder is not None:
            os.kill(holder, signal.SIGKILL)
