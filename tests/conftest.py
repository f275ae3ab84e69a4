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
from tests.support.vllm import Fleet, vllm_skipped, wanted

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_FLEET = pytest.StashKey[Fleet]()


def _xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (``make test`` runs two: ``-n 2 --dist loadgroup``)."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist with ``--dist loadgroup``: each test file is one unit
    of work, so that its module fixtures (a whole demo run, a Dynamo deployment)
    are made once, on one worker; the ``vllm`` tests of every file are one unit,
    scheduled first: one worker holds the fleet, whose starts (minutes of both
    cores) then overlap the other worker's tests."""
    if not (_xdist_worker(config) and config.getvalue("loadgroup")):
        return
    fleet_tests = [item for item in items if item.get_closest_marker("vllm")]
    rest = [item for item in items if not item.get_closest_marker("vllm")]
    for item in fleet_tests:
        item.add_marker(pytest.mark.xdist_group("vllm"))
    for item in rest:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items[:] = fleet_tests + rest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Runs once after collection: when a ``vllm`` test will run, the servers
    the collected tests name start now, one after the other, in the background
    (``tests/support/vllm.py``). On an xdist worker they start when its first
    ``vllm`` test asks for one: only one worker runs them."""
    markers = [m for m in (item.get_closest_marker("vllm") for item in session.items) if m]
    if vllm_skipped() or not markers:
        return
    import tempfile

    fleet = Fleet(Path(tempfile.mkdtemp(prefix="shadow-proxy-vllm-")))
    fleet.wanted = wanted([tuple(m.args) for m in markers])
    session.config.stash[_FLEET] = fleet
    if not _xdist_worker(session.config):
        fleet.launch(fleet.wanted)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Runs once at the end: every vLLM server of the fleet is stopped."""
    fleet = session.config.stash.get(_FLEET, None)
    if fleet is not None:
        fleet.stop()


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest) -> Fleet:
    """The session's vLLM fleet (started at collection); ``await fleet.ready(name)``."""
    fleet = request.config.stash.get(_FLEET, None)
    if fleet is None:  # collected without a vllm marker: each server starts when asked
        import tempfile

        fleet = Fleet(Path(tempfile.mkdtemp(prefix="shadow-proxy-vllm-")))
        request.config.stash[_FLEET] = fleet
    return fleet


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
