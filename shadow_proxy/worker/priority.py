"""The tap worker's CPU priority: below the serving loop, always.

Pure module (no aiohttp, no zmq). ``lower_priority`` is called once by the tap worker
process, after it has loaded its tokenizers and said ready (start-up keeps the normal
priority, so the ready timeout measures loading, not starvation) and before it reads
the hand-off. It guarantees, where the OS offers it, that the worker only gets CPU
no normal task wants:

- Linux: every thread of the process is moved to ``SCHED_IDLE`` (the kernel's idle
  class: a weight of 3 against 1,024 for a nice-0 task, and it never preempts one).
  Linux schedules threads, not processes, and ``sched_setscheduler(0, ...)`` moves the
  calling thread only, so each thread in ``/proc/self/task`` is moved; threads started
  afterwards (the tokenizer's Rust pool, ZeroMQ's I/O thread) inherit the class from
  the thread that starts them.
- Elsewhere, or when the kernel refuses (a seccomp profile): nice 19 for every thread
  (Linux) or the process (other systems). Nice 19 still gets about 1.5% of a core
  against each nice-0 task that wants it; that is the documented difference.

Leaving the idle class needs ``CAP_SYS_NICE`` (or an ``RLIMIT_NICE`` allowance), so it
is one-way for an unprivileged worker, as intended. Under CPU limits (cgroups), the
class orders the worker behind the serving loop inside the sidecar's cgroup; how the
sidecar's cgroup shares with the frontend's is the cgroup's weight, not this.

When the serving loop (or anything else) keeps the core busy, the worker does not
run: the hand-off fills and its drops are counted, and record lag grows; the worker's
heartbeats are late too. The supervisor's liveness check looks at the process only,
so a starved worker is not restarted.
"""

from __future__ import annotations

import os
import sys

import attrs

FALLBACK_NICE = 19
_TASKS = "/proc/self/task"


@attrs.frozen
class Priority:
    """What ``lower_priority`` achieved."""

    #: "idle" (SCHED_IDLE) or "nice".
    policy: str
    #: Threads moved (on Linux), or 1 for the process.
    threads: int
    #: Why the idle class was not used (None when it was).
    fallback_reason: str | None = None


def _thread_ids() -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(_TASKS))
    except OSError:
        return []


def _each_thread(apply) -> int:
    """Apply to every thread, again until no new thread appeared meanwhile."""
    done: set[int] = set()
    while True:
        pending = [tid for tid in _thread_ids() if tid not in done]
        if not pending:
            return len(done)
        for tid in pending:
            try:
                apply(tid)
            except ProcessLookupError:  # the thread ended meanwhile
                pass
            done.add(tid)


def lower_priority(*, fallback_nice: int = FALLBACK_NICE, idle: bool = True) -> Priority:
    """Put the calling process in the idle scheduling class, or at ``fallback_nice``
    (also when ``idle`` is false: ``worker.priority: nice``)."""
    reason = None
    if not idle:
        reason = "worker.priority is nice"
    elif hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        param = os.sched_param(0)
        try:
            threads = _each_thread(lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, param))
            return Priority("idle", threads)
        except OSError as e:
            reason = f"sched_setscheduler(SCHED_IDLE) refused: {e.strerror}"
    else:
        reason = f"no SCHED_IDLE on {sys.platform}"
    if os.path.isdir(_TASKS):
        threads = _each_thread(
            lambda tid: os.setpriority(os.PRIO_PROCESS, tid, max(fallback_nice, _nice(tid)))
        )
    else:
        os.setpriority(os.PRIO_PROCESS, 0, max(fallback_nice, _nice(0)))
        threads = 1
    return Priority("nice", threads, reason)


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def is_idle(tid: int = 0) -> bool:
    """Whether the thread ``tid`` (0: the calling one) is in the idle class."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    return os.sched_getscheduler(tid) == os.SCHED_IDLE
