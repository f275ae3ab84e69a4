"""Which records become trace requests, and what each one contributes.

Pure. ``Selection.take`` runs once per decoded envelope read from a source; it
guarantees that a record is used at most once per ``(publisher_id, tap, seq)``
(when the publisher id is unknown, as in record files, the request id and arrival
are added to the key so that two proxies' records with the same tap and seq both
count while a record read twice counts once), and that every record it refuses is
counted under one reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import numpy as np

from shadow_proxy.records.envelope import record_id
from shadow_proxy.trace.blocks import TokenError, token_array


@attrs.frozen
class TraceRequest:
    """One request as the trace tools see it."""

    arrival_unix_ns: int
    request_id: str
    model: str
    tap: str
    token_ids: np.ndarray  # u32
    #: joined records: the response's ``output_tokens``; request records: ``max_tokens``
    output_length: int | None
    #: the session the request belongs to (``request.agent_context.session_id``)
    session_id: str | None
    #: joined records only: the end of the response, in ns after arrival
    end_offset_ns: int | None
    #: a ``request_response`` record (it carries the response)
    joined: bool
    #: joined records only: the first output token, in ns after arrival
    first_token_offset_ns: int | None = None

    @property
    def input_length(self) -> int:
        return int(self.token_ids.size)


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _session_id(request: Mapping[str, Any]) -> str | None:
    """The session id where the record keeps it. The worker fills
    ``agent_context`` from the body forms Dynamo reads (an ``agent_context``
    object, or ``nvext.session_control.session_id``)."""
    context = request.get("agent_context")
    if isinstance(context, Mapping):
        session = context.get("session_id")
        if isinstance(session, str) and session:
            return session
    return None


@attrs.define
class Selection:
    """Dedups and parses envelopes; counts every record by what became of it."""

    taps: Collection[str] | None = None
    records: int = 0
    duplicates: int = 0
    other_tap: int = 0
    without_token_ids: int = 0
    invalid: Counter[str] = attrs.field(factory=Counter)
    kept: int = 0
    _seen: set[tuple[Any, ...]] = attrs.field(factory=set, init=False, repr=False)

    def take(
        self, envelope: Mapping[str, Any] | None, publisher_id: int | None = None
    ) -> TraceRequest | None:
        """The trace request a record stands for, or None (and counted why)."""
        self.records += 1
        if not isinstance(envelope, Mapping):
            self.invalid["not_a_map"] += 1
            return None
        tap, seq = envelope.get("tap"), envelope.get("seq")
        request = envelope.get("request")
        arrival = _count(envelope.get("arrival_unix_ns"))
        if not isinstance(tap, str) or _count(seq) is None:
            self.invalid["no_tap_or_seq"] += 1
            return None
        if not isinstance(request, Mapping):
            self.invalid["no_request"] += 1
            return None
        if arrival is None:
            self.invalid["no_arrival"] += 1
            return None
        request_id = record_id(envelope)  # a batch's prompts: one id each
        if publisher_id is not None:
            key: tuple[Any, ...] = (publisher_id, tap, seq)
        else:
            key = (None, tap, seq, request_id, arrival)
        if key in self._seen:
            self.duplicates += 1
            return None
        self._seen.add(key)
        if self.taps is not None and tap not in self.taps:
            self.other_tap += 1
            return None
        raw_tokens = request.get("token_ids")
        if not isinstance(raw_tokens, list | tuple) or not raw_tokens:
            self.without_token_ids += 1
            return None
        try:
            tokens = token_array(raw_tokens)
        except TokenError:
            self.invalid["bad_token_ids"] += 1
            return None
        response = envelope.get("response")
        end_offset = first_token = None
        if isinstance(response, Mapping):
            output_length = _count(response.get("output_tokens"))
            end_offset = _count(response.get("end_offset_ns"))
            first_token = _count(response.get("first_token_offset_ns"))
        else:
            stop = request.get("stop_conditions")
            output_length = _count(stop.get("max_tokens")) if isinstance(stop, Mapping) else None
        model = request.get("model")
        self.kept += 1
        return TraceRequest(
            arrival_unix_ns=arrival,
            request_id=request_id,
            model=model if isinstance(model, str) else "",
            tap=tap,
            token_ids=tokens,
            output_length=output_length,
            session_id=_session_id(request),
            end_offset_ns=end_offset,
            joined=isinstance(response, Mapping),
            first_token_offset_ns=first_token,
        )

    def summary(self) -> dict[str, Any]:
        """The counts, for reports and the closing message."""
        out: dict[str, Any] = {
            "records": self.records,
            "used": self.kept,
            "duplicates": self.duplicates,
            "without_token_ids": self.without_token_ids,
            "invalid": dict(sorted(self.invalid.items())),
        }
        if self.taps is not None:
            out["other_tap"] = self.other_tap
        return out
