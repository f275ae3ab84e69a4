"""The JetStream stream the ``nats`` taps publish to: create it, or check it (SPEC 9).

``ensure_stream`` runs on the publisher's thread each time a connection is
made (and after a publish found no stream): it reads the stream's info and,
when the stream does not exist, creates it from the ``nats`` section with the
subjects ``shadow.>`` (plus any tap subject outside it). When it exists, it
checks that its subjects cover every tap's subject and heartbeat subject; a
stream that does not is reported as a ``StreamCheck`` with a message naming
the stream, its subjects and the tap, never silently published around. Other
differences from the section (replicas, limits) are only logged: the
operator's stream wins.

The subject matching below is pure (NATS wildcards: ``*`` one token, ``>``
one or more trailing tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import attrs
import nats.errors
import nats.js.errors
from nats.js import api

from shadow_proxy.config import Discard, NatsConfig

log = logging.getLogger(__name__)

#: The subjects a stream created by the proxy takes (SPEC 9).
DEFAULT_SUBJECTS = ("shadow.>",)
#: How long JetStream remembers a ``Nats-Msg-Id`` (a retried publish within it
#: is stored once). Retries go on past it; the consumer's count by
#: (publisher_id, tap, seq) is what makes a later duplicate harmless.
DUPLICATE_WINDOW_S = 120.0
#: JetStream's err_code for a stream larger than the servers' store.
INSUFFICIENT_RESOURCES = 10047


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether a stream subject ``pattern`` (wildcards allowed) covers ``subject``."""
    want = pattern.split(".")
    have = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def uncovered(patterns: Sequence[str], subjects: Iterable[str]) -> list[str]:
    """The ``subjects`` that none of ``patterns`` covers, in order."""
    return [s for s in subjects if not any(subject_matches(p, s) for p in patterns)]


def stream_config(config: NatsConfig, subjects: Sequence[str]) -> api.StreamConfig:
    """The stream the proxy creates: ``shadow.>`` and the tap subjects outside it."""
    extra = uncovered(DEFAULT_SUBJECTS, subjects)
    return api.StreamConfig(
        name=config.stream,
        subjects=[*DEFAULT_SUBJECTS, *extra],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=config.replicas,
        max_bytes=config.max_bytes,
        max_age=config.max_age_s,
        discard=api.DiscardPolicy.NEW if config.discard is Discard.NEW else api.DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


@attrs.frozen
class StreamCheck:
    """What ``ensure_stream`` found. ``problem`` is None when the taps can publish;
    ``reason`` is a fixed word for the metric (``subjects``, ``refused``,
    ``unavailable``). A ``fatal`` problem is the configuration's, not the
    server's: found at start-up, it stops the proxy with ``problem``."""

    created: bool = False
    problem: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def fatal(self) -> bool:
        return self.reason in ("subjects", "refused")


async def ensure_stream(
    js: nats.js.JetStreamContext, config: NatsConfig, subjects: Sequence[str]
) -> StreamCheck:
    """Create the stream if it does not exist, else check it covers ``subjects``."""
    created = False
    try:
        try:
            info = await js.stream_info(config.stream)
        except nats.js.errors.NotFoundError:
            try:
                info = await js.add_stream(stream_config(config, subjects))
                created = True
                log.info(
                    "JetStream stream %s created (subjects %s, replicas %d)",
                    config.stream,
                    info.config.subjects,
                    config.replicas,
                )
            except nats.js.errors.ServiceUnavailableError:
                raise  # no answer (a leader election): not a refusal
            except nats.js.errors.APIError as refused:
                # 400 (another stream takes the subjects), 500 with err_code 10047
                # (insufficient storage resources): the server answered, and said no.
                # Another proxy of the fleet may have created it meanwhile: check that one.
                try:
                    info = await js.stream_info(config.stream)
                except nats.js.errors.NotFoundError:
                    return _refused(config, subjects, refused)
    except (nats.errors.Error, TimeoutError, OSError) as e:
        problem = f"JetStream did not answer about stream {config.stream!r} ({type(e).__name__})"
        return StreamCheck(problem=problem, reason="unavailable")
    patterns = list(info.config.subjects or [])
    missing = uncovered(patterns, subjects)
    if missing:
        problem = (
            f"JetStream stream {config.stream!r} has subjects {patterns}, which do not cover "
            f"{missing}: add them to the stream (nats stream edit) or change the taps' "
            "'subject' or 'nats.stream'"
        )
        return StreamCheck(problem=problem, reason="subjects")
    if not created:
        _note_differences(info.config, config)
    return StreamCheck(created=created)


def _refused(
    config: NatsConfig, subjects: Sequence[str], error: nats.js.errors.APIError
) -> StreamCheck:
    """JetStream would not create the stream (and no one else did): most often
    another stream already takes its subjects."""
    wanted = stream_config(config, subjects).subjects
    if error.err_code == INSUFFICIENT_RESOURCES:
        hint = "lower 'nats.max_bytes' (or 'nats.replicas'), or give the servers more store"
    else:
        hint = (
            "a stream that already takes these subjects can be named in 'nats.stream', "
            "or the taps given other subjects"
        )
    problem = (
        f"JetStream refused to create stream {config.stream!r} with subjects {wanted}: "
        f"{error.description or 'bad request'} (err_code {error.err_code}; {hint})"
    )
    return StreamCheck(problem=problem, reason="refused")


def _note_differences(found: api.StreamConfig, config: NatsConfig) -> None:
    wanted = {
        "replicas": (found.num_replicas, config.replicas),
        "max_bytes": (found.max_bytes, config.max_bytes),
        "max_age_s": (found.max_age, config.max_age_s),
        "discard": (getattr(found.discard, "value", found.discard), config.discard),
    }
    for key, (have, want) in wanted.items():
        if have != want:
            log.warning(
                "JetStream stream %s: %s is %s, the configuration says %s (the stream's is kept)",
                config.stream,
                key,
                have,
                want,
            )
