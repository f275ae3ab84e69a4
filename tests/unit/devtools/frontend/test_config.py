"""The configuration and the fault header parse strictly; errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_proxy.devtools.frontend import (
    Faults,
    MockConfig,
    MockRequestError,
)
from shadow_proxy.devtools.frontend.config import diverges


class TestFaultParsing:
    """The fault header parses strictly."""

    def test_combined(self) -> None:
        assert Faults.parse("hang, stop-after=2") == Faults(hang=True, stop_after=2)

    def test_gzip_bomb(self) -> None:
        assert Faults.parse("gzip-bomb=256") == Faults(gzip_bomb_mib=256)

    def test_empty(self) -> None:
        assert Faults.parse(None) == Faults()
        assert Faults.parse("") == Faults()

    @pytest.mark.parametrize(
        "text", ["status=200", "status=abc", "drop-after=-1", "hang=1", "drop-after", "nope"]
    )
    def test_invalid(self, text: str) -> None:
        with pytest.raises(MockRequestError):
            Faults.parse(text)


class TestConfigAndCli:
    """Configuration errors name the field; the CLI exits 2 on them."""

    def test_no_models(self) -> None:
        with pytest.raises(ValueError, match="'models'"):
            MockConfig(models={})

    def test_negative_itl(self, model_dirs: dict[str, Path]) -> None:
        with pytest.raises(ValueError, match=r"'itl_ms' must be at least 0 \(got -1\)"):
            MockConfig(models=model_dirs, itl_ms=-1)


class TestDivergesRule:
    """The divergence rule: by request id, a smaller fraction a subset of a larger."""

    def test_fraction_is_a_subset_rule(self) -> None:
        ids = [f"r{k}" for k in range(2000)]
        small = {i for i in ids if diverges(i, 0.1)}
        large = {i for i in ids if diverges(i, 0.3)}
        assert small < large
        assert 120 < len(small) < 280
        assert all(diverges(i, 1.0) for i in ids)
