"""What the demo runs: the reference runs, or the one run the options describe.

``plan`` runs once when the demo starts, on the parsed command line: without
``--stream``, ``--no-stream`` or ``--cancel-fraction`` (or with ``--runs
reference``) it gives the three reference runs (streaming; not streaming;
streaming with 25% of the requests cancelled by the client), else the one run
asked for; every run has the load shape of the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs


class DemoError(RuntimeError):
    """A run could not be carried out (a process failed, a wait timed out)."""


@attrs.frozen
class RunOptions:
    """One run: the load and where it goes."""

    title: str
    requests: int
    concurrency: int
    isl: int
    osl: int
    stream: bool
    cancel_fraction: float
    model: str
    tokenizer: Path


def reference_runs(args: argparse.Namespace) -> list[RunOptions]:
    """The three reference runs, with the load shape given on the command line."""
    shape = _shape(args)
    return [
        RunOptions("streaming", stream=True, cancel_fraction=0.0, **shape),
        RunOptions("non-streaming", stream=False, cancel_fraction=0.0, **shape),
        RunOptions("streaming, 25% cancelled", stream=True, cancel_fraction=0.25, **shape),
    ]


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "isl": args.isl,
        "osl": args.osl,
        "model": args.model,
        "tokenizer": args.tokenizer,
    }


def plan(args: argparse.Namespace) -> list[RunOptions]:
    """The runs the options ask for: the three reference runs unless a load option
    (``--stream``, ``--no-stream``, ``--cancel-fraction``) asks for a single one."""
    single = args.stream is not None or args.cancel_fraction is not None
    if args.runs == "reference" or (args.runs is None and not single):
        return reference_runs(args)
    stream = True if args.stream is None else args.stream
    cancel = args.cancel_fraction or 0.0
    title = "streaming" if stream else "non-streaming"
    if cancel:
        title += f", {cancel:.0%} cancelled"
    return [RunOptions(title, stream=stream, cancel_fraction=cancel, **_shape(args))]
