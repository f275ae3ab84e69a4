"""Completions with several prompts: one engine request per prompt, as Dynamo 1.6.1 serves them.

Pure. A ``prompt`` that is a list of at least two strings or token-id lists is
a batch: the frontend runs one generation per prompt (its engine request id is
``<id>-<i>``) and answers with the choices of all of them, choice ``j`` of
prompt ``i`` at index ``i * n + j``, and one ``usage`` summed over the prompts.
The preprocessor rebuilds each prompt's engine request from the body with that
prompt alone (``prompts``), and the joiner publishes one record per prompt,
with the request's id and a ``prompt_index`` (``worker/response/batch.py``
splits the answer). A one-element list is not a batch (the frontend takes its
single path).
"""

from __future__ import annotations

from typing import Any

import attrs

from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.fields import Reject, is_int


@attrs.frozen
class PreprocessedBatch:
    """The engine requests of a batch, in prompt order (``prompt_index`` = position)."""

    requests: tuple[PreprocessedRequest, ...]


def prompts(request: dict[str, Any]) -> list[Any] | None:
    """The prompts of a batch completions request, or None when it has one prompt."""
    prompt = request.get("prompt")
    if not isinstance(prompt, list) or len(prompt) < 2 or all(is_int(item) for item in prompt):
        return None
    if not all(isinstance(item, (str, list)) for item in prompt):
        raise Reject("invalid_field")
    return prompt
