"""What a replay run is given besides its records: ``ReplayOptions`` (one field
per ``shadow-replay`` option), the tokenizer ``--tokenizer`` names, and the
closed-loop options' arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs

from shadow_proxy.arguments import non_negative
from shadow_proxy.replay.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S
from shadow_proxy.replay.request import DEFAULT_REQUEST_ID_HEADER
from shadow_proxy.replay.stats import DEFAULT_MAX_SAMPLES
from shadow_proxy.replay.verdicts import DEFAULT_MAX_ERROR_RATE, DEFAULT_MIN_DIFF_MS


@attrs.frozen
class ReplayOptions:
    """Everything a run needs besides its records."""

    candidate: str
    #: None: no pairs.jsonl nor report (the live service without ``--out``).
    out_dir: Path | None
    baseline: str | None = None
    #: None: ``--speed max``.
    speed: float | None = 1.0
    concurrency: int = 16
    max_lag_s: float = 5.0
    model: str | None = None
    compare: bool = True
    live: bool = False
    #: None: ``verdicts.default_tolerance`` (5% with a baseline, 50% without).
    tolerance: float | None = None
    min_diff_ms: float = DEFAULT_MIN_DIFF_MS
    tokenizer: Path | None = None
    request_id_header: str = DEFAULT_REQUEST_ID_HEADER
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    max_samples: int = DEFAULT_MAX_SAMPLES
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    #: Read at most this many records / for this long (None: to the source's end).
    max_records: int | None = None
    duration_s: float | None = None
    #: ``--closed-loop`` (``closed_loop.py``): needs ``tokenizer``.
    closed_loop: bool = False
    #: ``--warmup N`` / ``--warmup-s S``: the first N records sent, or those that
    #: arrived within S s of the first, are replayed and left out of every count.
    warmup: int = 0
    warmup_s: float = 0.0
    #: ``--score``: teacher-forced scoring on the candidate and the baseline (K: top-K).
    score: bool = False
    score_top_k: int = 10

    @property
    def targets(self) -> dict[str, str]:
        """The deployments requests go to, by name."""
        out = {"candidate": self.candidate}
        if self.baseline and self.compare:
            out["baseline"] = self.baseline
        return out


def load_tokenizer(path: Path) -> Any:
    """``tokenizers.Tokenizer`` from a model directory's tokenizer.json (or the file)."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        msg = f"'--tokenizer' must name a tokenizer.json or a directory holding one (got {path})"
        raise ValueError(msg)
    return Tokenizer.from_file(str(file))


def add_closed_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """``--closed-loop``, ``--warmup``, ``--warmup-s`` (docs/replay.md, "Closed loop")."""
    parser.add_argument(
        "--closed-loop",
        action="store_true",
        help="within a conversation, send turn k+1 with the candidate's own answer to turn k "
        "(as the template renders it) the recorded think time after the candidate's turn k "
        "ended; needs --tokenizer",
    )
    parser.add_argument(
        "--warmup",
        type=non_negative(int),
        default=0,
        metavar="N",
        help="replay the first N records without counting them anywhere [%(default)s]",
    )
    parser.add_argument(
        "--warmup-s",
        type=non_negative(),
        default=0.0,
        metavar="S",
        help="replay the records that arrived within S s of the first without counting "
        "them [%(default)s]",
    )
