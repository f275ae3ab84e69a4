"""The preprocessed request: what the engine receives, as a Dynamo frontend builds it.

Field names follow Dynamo's ``PreprocessedRequest`` (SPEC section 3). This module
only holds the value; ``preprocess.py`` fills it and ``filters.py`` projects it
into a record, field by field.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class PreprocessedRequest:
    """One request as the engine sees it. Nested options are plain dicts with
    SPEC field names; a key whose value is unknown or unset is left out."""

    model: str
    token_ids: list[int]
    stop_conditions: dict[str, Any]
    sampling_options: dict[str, Any]
    output_options: dict[str, Any]
    eos_token_ids: list[int]
    annotations: list[str] = attrs.field(factory=list)
    routing: dict[str, Any] = attrs.field(factory=dict)
    extra_args: dict[str, Any] = attrs.field(factory=dict)
    multi_modal_data: dict[str, Any] = attrs.field(factory=dict)
    agent_context: dict[str, Any] = attrs.field(factory=dict)
    #: Dynamo's media-cache scope: the session id (from the session headers).
    image_cache_scope: str | None = None
    mdc_sum: str | None = None
    request_timestamp_ms: int | float | None = None
    #: Where the prompt's assistant answers sit (``worker/request/spans.py``), for
    #: ``shadow-replay --closed-loop``; None when unknown. An extension of this
    #: sidecar (Dynamo's request has no such field).
    prompt_spans: dict[str, Any] | None = None

    @property
    def has_multimodal(self) -> bool:
        return bool(self.multi_modal_data)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in attrs.fields(PreprocessedRequest))
