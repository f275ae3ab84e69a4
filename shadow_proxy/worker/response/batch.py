"""One prompt's share of a batch completions answer (``worker/request/batch.py``).

Pure. The recorder reads a batch answer like any other, with ``n`` times the
number of prompts as its choices; ``finalize`` settles the output tokens once
over all of them (usage apportioned, so the prompts' records add up to the
frontend's ``completion_tokens``). ``for_prompt`` then cuts out prompt ``i``:
its choices are the frontend's indices ``i * n`` to ``i * n + n - 1``,
renumbered from 0 as if the prompt had been sent alone, and its outcome is
decided over them alone. What the answer shows only as a whole stays whole in
every prompt's record: ``usage`` (summed over the prompts by the frontend),
``upstream_id``, timing offsets, HTTP status, errors of the exchange, a
cancelled client.
"""

from __future__ import annotations

import attrs

from shadow_proxy.worker.response.observed import FinalResponse
from shadow_proxy.worker.response.outcome import decide, is_error_reason


def for_prompt(final: FinalResponse, index: int, n: int) -> FinalResponse:
    """The part of ``final`` that answers prompt ``index`` of a batch of ``n``
    choices per prompt."""
    observed = final.observed
    low = index * n
    keep = [k for k, c in enumerate(observed.choices) if low <= c.index < low + n]
    choices = tuple(
        attrs.evolve(observed.choices[k], index=observed.choices[k].index - low) for k in keep
    )
    outcome, error = observed.outcome, observed.error
    if outcome != "cancelled":
        # The exchange's own errors (status, events, a broken stream) hold for every
        # prompt; a choice that finished with an error only for its prompt.
        by_choice = any(
            c.finish_reason and is_error_reason(c.finish_reason) for c in observed.choices
        )
        outcome, error = decide(
            observed.end,
            "",
            status=observed.http_status,
            error=None if by_choice or outcome != "error" else error,
            finished=[(c.index, c.finish_reason) for c in choices],
            n=n,
            problem=observed.body_problem,
        )
    return attrs.evolve(
        final,
        observed=attrs.evolve(observed, outcome=outcome, error=error, choices=choices, n=n),
        output_tokens=tuple(final.output_tokens[k] for k in keep),
        token_ids=tuple(final.token_ids[k] for k in keep),
        token_ids_complete=tuple(final.token_ids_complete[k] for k in keep),
    )
