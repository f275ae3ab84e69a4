"""The command lines' number types: values in range pass, others say why."""

from __future__ import annotations

import argparse
import re

import pytest

from shadow_proxy.arguments import fraction, non_negative, positive


class TestPositive:
    def test_in_range(self) -> None:
        assert positive(int)("3") == 3
        assert positive()("0.5") == 0.5

    @pytest.mark.parametrize("text", ["0", "-1"])
    def test_not_positive(self, text: str) -> None:
        with pytest.raises(
            argparse.ArgumentTypeError, match=f"must be positive \\(got '{text}'\\)"
        ):
            positive(int)(text)

    def test_not_a_number(self) -> None:
        with pytest.raises(
            argparse.ArgumentTypeError, match=re.escape("must be an integer (got 'x')")
        ):
            positive(int)("x")
        with pytest.raises(
            argparse.ArgumentTypeError, match=re.escape("must be a number (got '1.5.2')")
        ):
            positive()("1.5.2")


class TestNonNegative:
    def test_zero_is_fine(self) -> None:
        assert non_negative()("0") == 0.0
        assert non_negative(int)("0") == 0

    def test_negative(self) -> None:
        with pytest.raises(
            argparse.ArgumentTypeError, match=re.escape("must be at least 0 (got '-0.1')")
        ):
            non_negative()("-0.1")


class TestFraction:
    @pytest.mark.parametrize("text", ["0", "0.25", "1"])
    def test_in_range(self, text: str) -> None:
        assert fraction(text) == float(text)

    @pytest.mark.parametrize("text", ["-0.01", "1.5"])
    def test_out_of_range(self, text: str) -> None:
        with pytest.raises(argparse.ArgumentTypeError, match="must be between 0 and 1"):
            fraction(text)
