"""The built-in frontend's configuration and the faults a request can ask for.

``MockConfig`` is read once when the app is made (``app.py``) and never
changes; ``Faults.parse`` runs once per generation request, on the
``x-mock-fault`` header (or the ``mock_fault`` body field when a header cannot
be set), and rejects what it does not know, so that a typo in a test cannot
pass silently. ``MockRequestError`` is every rejection the frontend answers
with an OpenAI-style error body.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

FAULT_HEADER = "x-mock-fault"
FAULT_FIELD = "mock_fault"


class MockRequestError(ValueError):
    """A request the mock rejects; carries the HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _non_negative(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        msg = f"'{attribute.name}' must be at least 0 (got {value})"
        raise ValueError(msg)


def _positive(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        msg = f"'{attribute.name}' must be at least 1 (got {value})"
        raise ValueError(msg)


def _models(_inst: object, _attribute: attrs.Attribute, value: Mapping[str, Path]) -> None:
    if not value:
        msg = "'models' must name at least one model (got none)"
        raise ValueError(msg)


@attrs.frozen
class MockConfig:
    """What the mock serves and how fast. ``models`` maps a served name to a
    tokenizer directory in Hugging Face layout."""

    models: Mapping[str, Path] = attrs.field(
        converter=lambda m: {str(k): Path(v) for k, v in dict(m).items()}, validator=_models
    )
    ttft_ms: float = attrs.field(default=0.0, validator=_non_negative)
    itl_ms: float = attrs.field(default=0.0, validator=_non_negative)
    default_max_tokens: int = attrs.field(default=16, validator=_positive)
    #: Threads that encode prompts off the event loop (the tokenizer releases
    #: the GIL); 0 encodes inline on the loop.
    tokenizer_threads: int = attrs.field(default=1, validator=_non_negative)
    #: Fraction of requests (by request id, see ``diverges``) whose output
    #: differs from token position ``diverge_at`` on.
    diverge_fraction: float = attrs.field(default=0.0, validator=_non_negative)
    diverge_at: int = attrs.field(default=0, validator=_non_negative)


def diverges(request_id: str, fraction: float) -> bool:
    """Whether a request with this id diverges at ``diverge_fraction`` = fraction
    (a CRC-32 of the id: the same id always decides alike, and a smaller fraction
    selects a subset of a larger one)."""
    return zlib.crc32(request_id.encode()) < fraction * 2**32


def _count(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        msg = f"mock fault '{name}' needs a count of at least 0 (got {value!r})"
        raise MockRequestError(msg)
    return number


@attrs.frozen
class Faults:
    """What a request asks the mock to do wrong (or differently)."""

    #: Answer with this HTTP status and an OpenAI-style error body.
    status: int | None = None
    #: After this many tokens per choice, send an error event and end the stream.
    error_event_after: int | None = None
    #: After this many tokens per choice, abort the TCP connection.
    drop_after: int | None = None
    #: Send the headers, then nothing until the client goes away.
    hang: bool = False
    #: End the stream without a finish reason for this choice index.
    unfinished_choice: int | None = None
    #: Emit this many tokens, then finish with ``stop`` (an early EOS).
    stop_after: int | None = None
    #: Stream a gzip-encoded body that decodes to this many MiB of well-formed
    #: events (a decompression bomb, for the work budget and its benchmark).
    gzip_bomb_mib: int | None = None

    def stop_step(self, tokens: int) -> int | None:
        """The step at which a fault ends a generation of ``tokens`` steps (None:
        it runs to the end)."""
        steps = [s for s in (self.error_event_after, self.drop_after) if s is not None]
        return min(min(steps), tokens) if steps else None

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        """Parse ``status=503``, ``error-event-after=K``, ``drop-after=K``, ``hang``,
        ``unfinished-choice=I``, ``stop-after=K``, ``gzip-bomb=MIB``, comma-separated. Unknown
        directives are errors, so a typo in a test cannot pass silently."""
        if not text:
            return NO_FAULTS
        fields: dict[str, Any] = {}
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            name = name.strip()
            value = value.strip()
            if name == "hang" and not value:
                fields["hang"] = True
            elif name == "status":
                status = _count(name, value)
                if not 400 <= status <= 599:
                    msg = f"mock fault 'status' must be an error status 400-599 (got {value!r})"
                    raise MockRequestError(msg)
                fields["status"] = status
            elif name in (
                "error-event-after",
                "drop-after",
                "unfinished-choice",
                "stop-after",
                "gzip-bomb",
            ):
                field = "gzip_bomb_mib" if name == "gzip-bomb" else name.replace("-", "_")
                fields[field] = _count(name, value)
            else:
                msg = f"unknown mock fault {part.strip()!r}"
                raise MockRequestError(msg)
        return cls(**fields)


NO_FAULTS = Faults()
