"""How a process starts a child that never outlives it: one way, for every child.

The serving process starts the tap worker's main with ``spawn``, and the main
starts its shards the same way: ``python -m shadow_proxy.lifeline``, the target
named by its import path (the parent never imports it: the serving process
never loads the worker side) and its arguments pickled on the child's stdin.
The child's stdin then stays open, and that pipe is the lifeline: only the
parent holds its other end.

In the child (``main``), before the target is imported, two mechanisms, so that
a SIGKILL of the parent (which runs no cleanup) still ends the child and frees
what it holds (the tap ports) for the next start:

1. Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends the child
   SIGTERM when its parent dies (the worker's main then stops as at a normal
   shutdown; a shard, which has no handler, ends at once). The parent may have
   died before the call: the parent pid is checked after.
2. Everywhere (and if the signal is missed): a daemon thread reads stdin; the
   end of the file means the parent is gone, whatever ended it; the thread
   then sends SIGTERM itself.

Either way, if the child is still alive ``exit_after_s`` after its parent died
(a long job holds its loop), the thread ends the process with ``os._exit``.

The parent keeps the ``Popen`` (and so its end of the pipe) while the child
lives, and ``reap``s it when it has exited. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO

PR_SET_PDEATHSIG = 1
#: After the parent died, how long a child may take to stop on its own (the
#: worker's main: its last messages and the drain of ``control.DRAIN_S``, and a
#: margin); past this it exits without more ado.
EXIT_AFTER_S = 5.0
#: Exit status of a child that had to end itself after its parent died.
EXIT_ORPHANED = 3


def spawn(
    target: tuple[str, str],
    args: tuple[object, ...],
    *,
    exit_after_s: float = EXIT_AFTER_S,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``target`` (module, function) with ``args`` in a child process that
    ends when this process does (the module docstring)."""
    # The target in argv too, for ``ps`` (the child reads it from the pickle).
    process = subprocess.Popen(
        [sys.executable, "-m", "shadow_proxy.lifeline", ":".join(target)],
        stdin=subprocess.PIPE,
        env=None if env is None else dict(env),
        close_fds=True,
    )
    assert process.stdin is not None
    try:
        pickle.dump((target, os.getpid(), exit_after_s, args), process.stdin)
        process.stdin.flush()
    except BrokenPipeError:
        pass  # it died at once: its exit status says so
    return process


def reap(process: subprocess.Popen, timeout: float | None = None) -> int | None:
    """Wait up to ``timeout`` for a child that is ending; once it has exited, close
    this end of its lifeline. Returns its exit status (None: still running)."""
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    return code


def _parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the parent dies (Linux); True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(lifeline: IO[bytes], exit_after_s: float) -> None:
    # The file descriptor, not the buffered file: a thread blocked in a buffered
    # read holds its lock, and the interpreter aborts at exit when it finds it held.
    fd = lifeline.fileno()
    with contextlib.suppress(OSError):
        while os.read(fd, 1 << 16):
            pass  # nothing more is ever sent: only the end of the file counts
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(exit_after_s)
    os._exit(EXIT_ORPHANED)


def die_with_parent(parent_pid: int, lifeline: IO[bytes], exit_after_s: float) -> None:
    """Make the calling process end when its parent ``parent_pid`` dies."""
    _parent_death_signal(signal.SIGTERM)
    threading.Thread(
        target=_watch, args=(lifeline, exit_after_s), name="lifeline", daemon=True
    ).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    """The child's entry: bind its life to the parent's, then run the target."""
    lifeline = sys.stdin.buffer
    (module, function), parent_pid, exit_after_s, args = pickle.load(lifeline)
    die_with_parent(parent_pid, lifeline, exit_after_s)
    raise SystemExit(getattr(importlib.import_module(module), function)(*args))


if __name__ == "__main__":
    main()
