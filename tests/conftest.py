"""Fixtures for every test: the local model directories, test subscribers and
real nats-servers (``tests/support/nats.py``).

Plain helpers live in ``tests/support`` (servers, the subscriber, Dynamo);
fixtures that only some tests need live in the ``conftest.py`` beside them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import MODELS_DIR
from tests.support.nats import nats_cluster, nats_server  # noqa: F401 (fixtures)
from tests.support.subscriber import TapSubscriber

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def model_dirs() -> dict[str, Path]:
    """The two local model directories (built here if ``make models`` has not run)."""
    from shadow_proxy.devtools.modeldirs import build_all

    return build_all(MODELS_DIR)


@pytest.fixture
def subscribe() -> Iterator[Callable[..., TapSubscriber]]:
    """Opens test subscribers (``TapSubscriber(endpoint, topic)``); all are
    closed when the test ends."""
    opened: list[TapSubscriber] = []

    def open_subscriber(endpoint: str, topic: str, **options: Any) -> TapSubscriber:
        subscriber = TapSubscriber(endpoint, topic, **options)
        opened.append(subscriber)
        return subscriber

    yield open_subscriber
    for subscriber in opened:
        subscriber.close()
