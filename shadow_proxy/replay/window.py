"""The live replay's rolling window: the last ``window_s`` seconds of pairs,
judged with the batch report's own statistics.

Pure (numpy through ``stats``, no socket; the clock is passed in).
``Window.add`` runs once per replayed pair, as it finishes; a snapshot is made
on every refresh (at least every 5 s) in three steps: ``Window.preparing`` (the
counts, cheap, in steps: the service's loop serves between them), ``judge_latencies`` (the
bootstrap: up to a second of numpy on thousands of pairs, so the service runs
it in its judge process, ``judging``, on the ``JudgeRequest``: plain values
and float64 bytes) and ``Prepared.snapshot``; ``Window.judge`` does all three
here. A snapshot is made by feeding the window's pairs to a fresh ``stats.Tally`` (its
counts, its sample columns, its ``--max-error-rate`` gate) and calling
``verdicts.judge`` on its columns as ``Tally.latency`` does, so a window's
verdict is the one the batch report would give on the same pairs: paired
candidate/baseline with a baseline, candidate/primary without, the same
tolerance, ``--min-diff-ms`` and minimum of pairs. Past ``JUDGED_PAIRS`` the
judged pairs are a uniform sample of the window's (the batch report's
reservoir, ``stats.Samples``).

Memory bound: at most ``max_pairs`` pairs (the oldest go first past it), each
kept without its outputs (token ids and texts are dropped once compared): a
few hundred bytes a pair, about 2 MB at 20 records/s over the default 300 s.

What a snapshot holds (``Snapshot``):

- per metric (ttft, itl, e2e): the p50 ratio and its 95% interval, and the
  verdict as a number: 1 higher (the candidate is worse), 0 no difference
  beyond noise, -1 lower, NaN without a verdict (too few pairs, too many
  failures);
- ``output``: 1 when more than ``max_error_rate`` of the compared outputs
  differ where the reference's do not (with a baseline: Diffy's noise floor,
  ``compare.counted``; without one every difference counts), 0 otherwise, NaN
  below ``verdicts.MIN_PAIRS`` compared outputs;
- per target, the share of greedy records (``temperature`` 0) whose output
  equals the primary's (NaN without any compared);
- the number of pairs in the window.
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Mapping
from typing import Any, Protocol

import attrs
import numpy as np

from shadow_proxy.replay.compare import Difference, Observation
from shadow_proxy.replay.request import CandidateRequest
from shadow_proxy.replay.stats import METRICS, Samples, Tally
from shadow_proxy.replay.verdicts import HIGHER, LOWER, MIN_PAIRS, NO_DIFFERENCE, judge

DEFAULT_WINDOW_S = 300.0
#: Pairs a window holds at most (the oldest go first past it).
DEFAULT_MAX_PAIRS = 50_000
#: Pairs a verdict is computed on at most: past it, a uniform sample of the
#: window's (``stats.Samples``' seeded reservoir, as the batch report past
#: ``--max-samples``). The paired bootstrap's cost grows with the pairs: 6,000
#: (20 records/s over 300 s) took 4.6 s of a loaded core, 2,000 a third of it.
JUDGED_PAIRS = 2_000
#: Pairs ``Window.preparing`` counts between two yields (a few ms of Python).
PREPARE_STEP = 200
#: ``shadow_replay_verdict`` values by ``verdicts`` verdict (no_verdict: NaN).
VERDICT_VALUES = {HIGHER: 1.0, NO_DIFFERENCE: 0.0, LOWER: -1.0}
NAN = float("nan")


def _light(observation: Observation | None) -> Observation | None:
    """The observation without its outputs (compared already, and large)."""
    if observation is None or (observation.token_ids is None and observation.texts is None):
        return observation
    return attrs.evolve(observation, token_ids=None, texts=None)


def greedy(body: Mapping[str, Any]) -> bool:
    """Whether a request's output is determined: ``temperature`` 0."""
    temperature = body.get("temperature")
    return isinstance(temperature, int | float) and temperature == 0


class PairObserver(Protocol):
    """Told of every record as the tally is (the live service's window and
    metrics): ``pair`` once per replayed request as it finishes, ``skipped``
    once per record not sent."""

    def pair(
        self,
        request: CandidateRequest,
        primary: Observation | None,
        candidate: Observation,
        diff: Difference | None,
        baseline: Observation | None,
        baseline_diff: Difference | None,
    ) -> None: ...

    def skipped(self, reason: str) -> None: ...


@attrs.frozen
class Pair:
    """One replayed record as the window keeps it."""

    at_ns: int
    primary: Observation | None
    candidate: Observation
    diff: Difference | None
    baseline: Observation | None = None
    baseline_diff: Difference | None = None
    greedy: bool = False


@attrs.frozen
class Snapshot:
    """The window's figures at one moment (see the module doc)."""

    pairs: int
    #: metric -> (p50 ratio, low, high), NaN where there is none.
    ratios: dict[str, tuple[float, float, float]]
    #: ttft, itl, e2e, output -> 1, 0, -1 or NaN.
    verdicts: dict[str, float]
    #: target -> share of greedy records whose output equals the primary's.
    exact_match: dict[str, float]
    #: metric -> the verdict's reason in words (for /healthz and logs).
    reasons: dict[str, str]


@attrs.define
class Window:
    """The pairs of the last ``window_s`` seconds; judged like a batch report."""

    has_baseline: bool
    tolerance: float
    min_diff_ms: float
    max_error_rate: float
    window_s: float = DEFAULT_WINDOW_S
    max_pairs: int = DEFAULT_MAX_PAIRS
    _pairs: collections.deque[Pair] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not self.window_s > 0:
            msg = f"'window_s' must be above 0 (got {self.window_s})"
            raise ValueError(msg)
        self._pairs = collections.deque(maxlen=self.max_pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, pair: Pair) -> None:
        """Keep one finished pair (its outputs dropped)."""
        primary, baseline = _light(pair.primary), _light(pair.baseline)
        candidate = attrs.evolve(pair.candidate, token_ids=None, texts=None)
        self._pairs.append(
            attrs.evolve(pair, primary=primary, candidate=candidate, baseline=baseline)
        )

    def expire(self, now_ns: int) -> None:
        """Drop the pairs older than ``window_s`` at ``now_ns``."""
        oldest = now_ns - int(self.window_s * 1e9)
        while self._pairs and self._pairs[0].at_ns < oldest:
            self._pairs.popleft()

    def pairs(self, now_ns: int) -> list[Pair]:
        """The window's pairs at ``now_ns`` (a copy: it is judged while more come)."""
        self.expire(now_ns)
        return list(self._pairs)

    def judge(self, pairs: list[Pair]) -> Snapshot:
        """The snapshot of ``pairs`` (from ``pairs``), in this process: ``prepare``,
        ``judge_latencies``, ``Prepared.snapshot`` (the service runs the middle
        step in its judge process, ``judging``)."""
        prepared = self.prepare(pairs)
        return prepared.snapshot(judge_latencies(prepared.request))

    def prepare(self, pairs: list[Pair]) -> Prepared:
        """The cheap part of a snapshot (``preparing`` in one go)."""
        steps = self.preparing(pairs, len(pairs) + 1)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def preparing(
        self, pairs: list[Pair], step: int = PREPARE_STEP
    ) -> Generator[None, None, Prepared]:
        """The cheap part of a snapshot: ``pairs`` fed to a ``stats.Tally``, the
        output verdict and exact match counted, and the latency columns (at most
        ``JUDGED_PAIRS`` values each) put in a ``JudgeRequest``, returned. It
        yields after every ``step`` pairs (the service's loop serves between)."""
        tally = Tally(
            has_baseline=self.has_baseline,
            tolerance=self.tolerance,
            min_diff_ms=self.min_diff_ms,
            max_error_rate=self.max_error_rate,
            samples=Samples(max_samples=JUDGED_PAIRS),
        )
        matched = {"candidate": [0, 0], "baseline": [0, 0]}
        for n, p in enumerate(pairs, 1):
            if n % step == 0:
                yield
            tally.add(p.primary, p.candidate, p.diff, p.baseline, p.baseline_diff)
            if not p.greedy:
                continue
            for target, diff in (("candidate", p.diff), ("baseline", p.baseline_diff)):
                if diff is not None and diff.output_equal is not None:
                    matched[target][0] += diff.output_equal
                    matched[target][1] += 1
        reference = "baseline" if self.has_baseline else "primary"
        column = tally.samples.column
        request = JudgeRequest(
            reference=reference,
            tolerance=self.tolerance,
            min_diff_ms=self.min_diff_ms,
            failed=tally.failed(),
            min_pairs=tally.min_pairs,
            columns={
                m: (column(f"{m}.candidate").tobytes(), column(f"{m}.{reference}").tobytes())
                for m in METRICS
            },
        )
        counted = tally.fields["output"].counted
        if tally.compared < MIN_PAIRS:
            output = (NAN, f"{tally.compared} outputs compared, at least {MIN_PAIRS} needed")
        else:
            output = (
                float(counted > self.max_error_rate * tally.compared),
                f"{counted} of {tally.compared} outputs differ (counted)",
            )
        targets = ("candidate", "baseline") if self.has_baseline else ("candidate",)
        exact = {t: matched[t][0] / matched[t][1] if matched[t][1] else NAN for t in targets}
        return Prepared(len(pairs), request, output, exact)


@attrs.frozen
class JudgeRequest:
    """What the latency verdicts need, and only that (plain values and the
    columns as float64 bytes: what is sent to the judge process)."""

    reference: str
    tolerance: float
    min_diff_ms: float
    failed: str | None
    min_pairs: int
    #: metric (``stats.METRICS``) -> (candidate, reference) float64 bytes.
    columns: dict[str, tuple[bytes, bytes]]


#: metric name (ttft, itl, e2e) -> (p50 ratio, low, high, verdict value, reason).
Latencies = dict[str, tuple[float, float, float, float, str]]


def judge_latencies(request: JudgeRequest) -> Latencies:
    """The latency verdicts of ``request`` (``verdicts.judge``, the bootstrap:
    the costly part); plain numbers back."""
    judged: Latencies = {}
    for metric, (candidate, reference) in request.columns.items():
        j = judge(
            np.frombuffer(candidate, dtype=np.float64),
            np.frombuffer(reference, dtype=np.float64),
            reference_name=request.reference,
            tolerance=request.tolerance,
            min_diff_ms=request.min_diff_ms,
            failed=request.failed,
            min_pairs=request.min_pairs,
        )
        ratio, ci = j.ratio_p50, j.ci95
        judged[metric.removesuffix("_ms")] = (
            NAN if ratio is None else float(ratio),
            NAN if ci is None else float(ci[0]),
            NAN if ci is None else float(ci[1]),
            VERDICT_VALUES.get(j.verdict, NAN),
            j.reason,
        )
    return judged


@attrs.frozen
class Prepared:
    """A snapshot but for its latency verdicts (``Window.prepare``)."""

    pairs: int
    request: JudgeRequest
    #: The output verdict and its reason.
    output: tuple[float, str]
    exact_match: dict[str, float]

    def snapshot(self, latencies: Latencies) -> Snapshot:
        """The snapshot, with the latency verdicts of ``judge_latencies``."""
        ratios = {name: values[:3] for name, values in latencies.items()}
        verdicts = {name: values[3] for name, values in latencies.items()}
        reasons = {name: values[4] for name, values in latencies.items()}
        verdicts["output"], reasons["output"] = self.output
        return Snapshot(self.pairs, ratios, verdicts, self.exact_match, reasons)


def empty_snapshot(has_baseline: bool) -> Snapshot:
    """What the gauges read before the first refresh: no pairs, no verdict."""
    names = [m.removesuffix("_ms") for m in METRICS]
    targets = ("candidate", "baseline") if has_baseline else ("candidate",)
    return Snapshot(
        0,
        {n: (NAN, NAN, NAN) for n in names},
        {n: NAN for n in (*names, "output")},
        {t: NAN for t in targets},
        {n: "no pairs yet" for n in (*names, "output")},
    )
