"""Number types for the command lines: one wording for every tool's errors.

``argparse`` calls these on option values; a bad value is an
``ArgumentTypeError`` whose text says what was expected and what was given
(``must be positive (got '0')``), and argparse turns it into exit status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(kind: Callable[[str], float], text: str) -> float:
    try:
        return kind(text)
    except ValueError:
        msg = f"must be {'an integer' if kind is int else 'a number'} (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None


def positive(kind: Callable[[str], float] = float) -> Callable[[str], float]:
    """A number above 0 (``kind`` int or float)."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if not value > 0:
            msg = f"must be positive (got {text!r})"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def non_negative(kind: Callable[[str], float] = float) -> Callable[[str], float]:
    """A number of at least 0 (``kind`` int or float)."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if value < 0:
            msg = f"must be at least 0 (got {text!r})"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def fraction(text: str) -> float:
    """A number from 0 to 1."""
    value = _number(float, text)
    if not 0.0 <= value <= 1.0:
        msg = f"must be between 0 and 1 (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value
