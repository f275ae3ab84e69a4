"""The record: one envelope per request per tap (SPEC section 3).

Pure values. Field names follow Dynamo's shadow tap envelope (schema version 1),
so a consumer written for Dynamo's ``ShadowEnvelope`` reads these records as they
are: the fields Dynamo requires are always present (``filters`` even when empty),
the optional ones are left out when empty, never sent as nil. ``sample_rate`` is
ours; a Dynamo reader ignores it. So is ``prompt_index``, present only in the
records of a batch completions request (one record per prompt, all with the
request's id): a record is identified by ``(request_id, prompt_index)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ENVELOPE_SCHEMA_VERSION = 1
ORIGINS = frozenset({"chat", "completions", "responses", "other"})
OUTCOMES = frozenset({"complete", "incomplete", "cancelled", "error"})

#: Fields every envelope carries; a consumer rejects a record without them.
REQUIRED_FIELDS = (
    "schema_version",
    "tap",
    "seq",
    "request_id",
    "origin",
    "filters",
    "arrival_unix_ns",
    "request",
)


def build_envelope(
    *,
    tap: str,
    seq: int | None,
    request_id: str,
    origin: str,
    filters: Sequence[str],
    arrival_unix_ns: int,
    sample_rate: float,
    request: Mapping[str, Any],
    response: Mapping[str, Any] | None,
    prompt_index: int | None = None,
) -> dict[str, Any]:
    """The envelope as a map ready for ``wire.encode_envelope``.

    ``request`` is the projected preprocessed request (``FilterSet.project``); it
    is referenced, not copied, so taps sharing a projection share one dict.
    ``response`` is present only for ``request_response`` taps;
    ``prompt_index`` only for the records of a batch's prompts. ``seq`` None: the
    seq is written by the owner of the tap's seqs (``worker/sink.py``), which
    encodes around it.
    """
    if origin not in ORIGINS:
        msg = f"'origin' must be one of {sorted(ORIGINS)} (got {origin!r})"
        raise ValueError(msg)
    if not 0.0 <= sample_rate <= 1.0:
        msg = f"'sample_rate' must be within 0..1 (got {sample_rate!r})"
        raise ValueError(msg)
    envelope: dict[str, Any] = {
        "schema_version": ENVELOPE_SCHEMA_VERSION,
        "tap": tap,
        "seq": seq,
        "request_id": request_id,
        "origin": origin,
        "filters": list(filters),
        "arrival_unix_ns": arrival_unix_ns,
        "sample_rate": float(sample_rate),
        "request": request,
    }
    if response is not None:
        envelope["response"] = response
    if prompt_index is not None:
        envelope["prompt_index"] = prompt_index
    return envelope


def record_id(envelope: Mapping[str, Any]) -> str:
    """The id that names one record's engine request: ``request_id``, or for a
    prompt of a batch ``{request_id}-{prompt_index}`` (the id Dynamo gives that
    prompt's engine request and trace row). Unique per request, unlike
    ``request_id`` alone."""
    request_id = envelope.get("request_id")
    request_id = request_id if isinstance(request_id, str) else ""
    index = envelope.get("prompt_index")
    return request_id if index is None else f"{request_id}-{index}"


def missing_fields(envelope: Mapping[str, Any]) -> list[str]:
    """Required fields an envelope lacks (empty when it is whole)."""
    return [name for name in REQUIRED_FIELDS if name not in envelope]


def _index(value: Any) -> bool:
    return type(value) is int and value >= 0


def check_envelope(envelope: Any) -> str | None:
    """None if a decoded envelope can be read as a record, else why not
    (``record``: a field missing or of the wrong type; ``schema``: another
    schema version)."""
    if not isinstance(envelope, dict) or missing_fields(envelope):
        return "record"
    if envelope["schema_version"] != ENVELOPE_SCHEMA_VERSION:
        return "schema"
    request = envelope["request"]
    seq = envelope["seq"]
    response = envelope.get("response")
    if (
        type(seq) is not int
        or seq < 0
        or not isinstance(envelope["tap"], str)
        or not isinstance(request, dict)
        or not isinstance(request.get("token_ids", []), list)
        or (response is not None and not isinstance(response, dict))
        or (response is not None and type(response.get("output_tokens", 0)) is not int)
        or not _index(envelope.get("prompt_index", 0))
    ):
        return "record"
    return None
