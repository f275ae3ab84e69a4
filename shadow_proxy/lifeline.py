"""A child never outlives its parent: how the tap worker dies with the serving process.

Runs in the spawned child, before the worker's main is imported
(``worker_entry`` is what the supervisor spawns). Two mechanisms, so that a
SIGKILL of the serving process (which runs no cleanup) still ends the worker
and frees its tap ports for the next start:

1. Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends the worker
   SIGTERM when its parent dies; the worker then stops as at a normal
   shutdown (its queued records are published for up to ``control.DRAIN_S``).
   The parent may have died before the call: the parent pid is checked after.
2. Everywhere (and if the signal is missed): a daemon thread waits on the
   pipe ``multiprocessing`` keeps to the parent (its ``parent_process()``
   sentinel, readable when the parent is gone); then it sends SIGTERM itself.

Either way, if the worker is still alive ``EXIT_AFTER_S`` after its parent
died (a long job holds the loop), the thread ends the process with
``os._exit``. The bound on an orphaned worker's life is therefore
``EXIT_AFTER_S`` plus the thread's wake-up.

This module imports only the standard library and ``channel``: the worker
process does not load the serving side (aiohttp) by being spawned from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time

from shadow_proxy.channel import control

PR_SET_PDEATHSIG = 1
#: After the parent died: the worker's own shutdown (last messages, drain),
#: then a margin; past this the process exits without more ado.
EXIT_AFTER_S = control.DRAIN_S + 3.0
#: Exit status of a worker that had to end itself after its parent died.
EXIT_ORPHANED = 3
#: Without a multiprocessing sentinel, how often the parent pid is checked.
POLL_S = 0.5


def _parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the parent dies (Linux); True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _wait_for_parent_death(parent_pid: int) -> None:
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        multiprocessing.connection.wait([parent.sentinel])
        return
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)


def _watch(parent_pid: int, exit_after_s: float) -> None:
    _wait_for_parent_death(parent_pid)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(exit_after_s)
    os._exit(EXIT_ORPHANED)


def die_with_parent(parent_pid: int, exit_after_s: float = EXIT_AFTER_S) -> None:
    """Make the calling process end when ``parent_pid`` (its parent) dies."""
    _parent_death_signal(signal.SIGTERM)
    threading.Thread(
        target=_watch, args=(parent_pid, exit_after_s), name="parent-watch", daemon=True
    ).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def worker_entry(main: tuple[str, str], parent_pid: int, *args: object) -> None:
    """Runs in the spawned child: bind its life to the parent's, then import
    the worker's main by name and run it."""
    die_with_parent(parent_pid)
    module, function = main
    raise SystemExit(getattr(importlib.import_module(module), function)(*args))
