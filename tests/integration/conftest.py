"""Tests with real processes: every test here is marked ``integration``, so
``pytest -m "not integration"`` runs the unit tests alone; the NATS server
fixtures (``nats_harness``) are shared by the JetStream tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.nats_harness import nats_cluster, nats_server  # noqa: F401 (fixtures)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs once after collection: marks the tests of this directory."""
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)
