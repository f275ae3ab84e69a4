"""Per-choice output as a response streams by, within its memory caps.

Pure. The recorder's parsers (chat and completions chunks, unary bodies) add
text and upstream token ids to a ``ChoiceTable``; it keeps at most
``max_choices`` choice indices, ``max_text_bytes_per_choice`` of UTF-8 text per
choice and ``max_text_bytes_total`` in all, ``max_token_ids_per_choice`` ids
per choice and ``max_token_ids_total`` in all (4 bytes each). Past a cap the
text or ids are cut (``truncated``) and counting goes on.
"""

from __future__ import annotations

from array import array
from typing import Any

import attrs

from shadow_proxy.worker.response.observed import ObservedChoice

_ID_TYPE = "I" if array("I").itemsize >= 4 else "L"


class Choice:
    """One choice's output as it accumulates."""

    __slots__ = (
        "content_chunks",
        "finish_reason",
        "id_count",
        "ids",
        "index",
        "text",
        "text_truncated",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.finish_reason: str | None = None
        self.text = bytearray()
        self.text_truncated = False
        self.content_chunks = 0
        self.ids: array[int] | None = None
        self.id_count = 0


@attrs.define
class ChoiceTable:
    """The choices of one response, by index."""

    max_text_bytes_per_choice: int
    max_text_bytes_total: int
    max_token_ids_per_choice: int
    max_token_ids_total: int
    max_choices: int
    choices: dict[int, Choice] = attrs.field(factory=dict)
    text_total: int = 0
    ids_total: int = 0
    #: Choice entries ignored (index not a small non-negative int, or over the cap).
    ignored: int = 0

    def get(self, index: Any) -> Choice | None:
        choice = self.choices.get(index) if type(index) is int else None
        if choice is not None:
            return choice
        if type(index) is not int or index < 0 or len(self.choices) >= self.max_choices:
            self.ignored += 1
            return None
        choice = self.choices[index] = Choice(index)
        return choice

    def add_text(self, choice: Choice, piece: str) -> None:
        if choice.text_truncated:
            return
        self.add_utf8(choice, piece.encode("utf-8", "replace"))

    def add_utf8(self, choice: Choice, data: bytes) -> None:
        """``add_text`` of the text whose (valid) UTF-8 is ``data``."""
        if choice.text_truncated:
            return
        room = min(
            self.max_text_bytes_per_choice - len(choice.text),
            self.max_text_bytes_total - self.text_total,
        )
        if len(data) > room:
            # Cut at a character boundary; nothing more is kept for this choice.
            data = data[: max(room, 0)].decode("utf-8", "ignore").encode("utf-8")
            choice.text_truncated = True
        choice.text += data
        self.text_total += len(data)

    def add_ids(self, choice: Choice, ids: list[Any]) -> bool:
        if choice.ids is None:
            choice.ids = array(_ID_TYPE)
        kept = choice.ids
        room = min(
            self.max_token_ids_per_choice - len(kept), self.max_token_ids_total - self.ids_total
        )
        before = len(kept)
        try:
            kept.extend(ids[: max(room, 0)])
        except (TypeError, OverflowError):
            del kept[before:]
            return False
        self.ids_total += len(kept) - before
        choice.id_count += len(ids)
        return True

    def observed(self) -> tuple[ObservedChoice, ...]:
        """The choices as values, sorted by index."""
        return tuple(self._observed(c) for _, c in sorted(self.choices.items()))

    def finish_reasons(self) -> list[tuple[int, str | None]]:
        return [(i, c.finish_reason) for i, c in sorted(self.choices.items())]

    def clear(self) -> None:
        self.choices = {}

    @staticmethod
    def _observed(choice: Choice) -> ObservedChoice:
        return ObservedChoice(
            index=choice.index,
            finish_reason=choice.finish_reason,
            text=choice.text.decode("utf-8", "replace"),
            text_truncated=choice.text_truncated,
            content_chunks=choice.content_chunks,
            upstream_token_ids=choice.ids,
            upstream_token_count=choice.id_count,
        )
