"""What the demo runs: the reference runs, the multi-turn run, the replay run, or
the one run the options describe.

``plan`` runs once when the demo starts, on the parsed command line. Without
``--stream``, ``--no-stream``, ``--cancel-fraction`` or ``--api`` (``--runs
all``) it gives, in order: the four reference runs (chat streaming; chat not
streaming; chat streaming with 25% of the requests cancelled by the client;
Responses API streaming with 25% cancelled), the multi-turn run
(``--conversations`` x ``--turns``) and the replay run (the first run's joined
records replayed to a slower, diverging candidate). ``--runs reference``,
``multi-turn`` and ``replay`` pick a part (``replay`` with the first reference
run it replays); a load option asks for the one run it describes. Every load
run has the load shape of the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs

#: What ``--runs`` accepts.
RUN_SETS = ("all", "reference", "multi-turn", "replay", "single")


class DemoError(RuntimeError):
    """A run could not be carried out (a process failed, a wait timed out)."""


@attrs.frozen
class RunOptions:
    """One run through the proxy: the load and where it goes.

    ``kind`` is ``load`` (``requests`` independent requests of ``api``) or
    ``multi-turn`` (``conversations`` x ``turns`` streaming chat requests, each
    turn resending its conversation's history)."""

    title: str
    requests: int
    concurrency: int
    isl: int
    osl: int
    stream: bool
    cancel_fraction: float
    model: str
    tokenizer: Path
    api: str = "chat"
    kind: str = "load"
    conversations: int = 0
    turns: int = 0


@attrs.frozen
class ReplayPlan:
    """The replay run: the joined records of run ``source_run`` (1-based) replayed
    to a candidate built-in frontend ``extra_ttft_ms``/``extra_itl_ms`` slower than
    the primary, diverging from token ``diverge_at`` on for ``diverge_fraction``
    of the requests, with a baseline identical to the primary."""

    source_run: int
    extra_ttft_ms: float
    extra_itl_ms: float
    diverge_fraction: float
    diverge_at: int
    concurrency: int
    title: str = "replay"
    kind: str = "replay"


def reference_runs(args: argparse.Namespace) -> list[RunOptions]:
    """The four reference runs, with the load shape given on the command line."""
    shape = _shape(args)
    return [
        RunOptions("streaming", stream=True, cancel_fraction=0.0, **shape),
        RunOptions("non-streaming", stream=False, cancel_fraction=0.0, **shape),
        RunOptions("streaming, 25% cancelled", stream=True, cancel_fraction=0.25, **shape),
        RunOptions(
            "responses, streaming, 25% cancelled",
            stream=True,
            cancel_fraction=0.25,
            api="responses",
            **shape,
        ),
    ]


def multi_turn_run(args: argparse.Namespace) -> RunOptions:
    """``--conversations`` x ``--turns``, each conversation one turn at a time."""
    shape = _shape(args)
    shape.update(requests=args.conversations * args.turns, concurrency=args.conversations)
    title = f"multi-turn, {args.conversations} conversations x {args.turns} turns"
    return RunOptions(
        title,
        stream=True,
        cancel_fraction=0.0,
        kind="multi-turn",
        conversations=args.conversations,
        turns=args.turns,
        **shape,
    )


def replay_plan(args: argparse.Namespace, source_run: int) -> ReplayPlan:
    return ReplayPlan(
        source_run=source_run,
        extra_ttft_ms=args.candidate_extra_ttft_ms,
        extra_itl_ms=args.candidate_extra_itl_ms,
        diverge_fraction=args.candidate_diverge_fraction,
        diverge_at=args.candidate_diverge_at,
        concurrency=args.concurrency,
    )


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "isl": args.isl,
        "osl": args.osl,
        "model": args.model,
        "tokenizer": args.tokenizer,
    }


def plan(args: argparse.Namespace) -> list[RunOptions | ReplayPlan]:
    """The runs the options ask for, in order (see the module docstring)."""
    single = args.stream is not None or args.cancel_fraction is not None or args.api is not None
    runs = args.runs or ("single" if single else "all")
    if runs == "all":
        return [*reference_runs(args), multi_turn_run(args), replay_plan(args, 1)]
    if runs == "reference":
        return list(reference_runs(args))
    if runs == "multi-turn":
        return [multi_turn_run(args)]
    if runs == "replay":
        return [reference_runs(args)[0], replay_plan(args, 1)]
    stream = True if args.stream is None else args.stream
    cancel = args.cancel_fraction or 0.0
    api = args.api or "chat"
    title = ("" if api == "chat" else f"{api}, ") + ("streaming" if stream else "non-streaming")
    if cancel:
        title += f", {cancel:.0%} cancelled"
    return [RunOptions(title, stream=stream, cancel_fraction=cancel, api=api, **_shape(args))]
