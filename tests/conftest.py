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
from tests.support.vllm import FLEET_SCOPE, Fleet, fleet_file, vllm_skipped, wanted

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_FLEET = pytest.StashKey[Fleet]()


def _xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (``make test`` runs two: ``-n 2 --dist loadfile``)."""
    return hasattr(config, "workerinput")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the vLLM fleet's test files as one unit: each
    test file is one unit of work, so that its module fixtures (a whole demo
    run, a Dynamo deployment) are made once, on one worker; every ``vllm`` test
    runs on one worker, which holds the fleet. (xdist's ``loadgroup`` would say
    this with markers, but its groups are lost under pytest 9: it renames
    ``item._nodeid``, which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Files in the order collected (the fleet's first), not by how many tests
    # each holds (xdist's default): the fleet's few tests would wait behind the
    # unit test files, and its start would overlap nothing.
    config.option.loadscopereorder = False

    class FilesFleetTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return FLEET_SCOPE if fleet_file(path) else path

    return FilesFleetTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the ``vllm`` tests come first (the scheduler hands out
    files in the order collected), so that the fleet's starts (minutes of both
    cores) overlap the other worker's tests."""
    if not _xdist_worker(config):
        return
    fleet_tests = [item for item in items if item.get_closest_marker("vllm")]
    items[:] = fleet_tests + [item for item in items if not item.get_closest_marker("vllm")]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``vllm`` test outside the fleet's files (``fleet_file``) fails: under
    xdist it could run on the other worker and start a second fleet."""
    if item.get_closest_marker("vllm") and not fleet_file(item.nodeid):
        pytest.fail(
            f"{item.nodeid}: a vllm test belongs in tests/integration/*vllm*.py "
            "(the files the xdist scheduler keeps on the fleet's worker)",
            pytrace=False,
        )


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
