"""Tests with real processes: every test here is marked ``integration``, so
``pytest -m "not integration"`` runs the unit tests alone."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs once after collection: marks the tests of this directory."""
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)
