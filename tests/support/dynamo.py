"""The rule for tests that need the real Dynamo (marker ``dynamo``), and the
frontend they share: Dynamo with a ``deepseek`` and a ``chatml`` mocker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadow_proxy.devtools.dynamo import Dynamo, DynamoUnavailable, dynamo_python, start_dynamo
from tests.support import MODELS_DIR

#: Set to 1 to skip the tests that need the real Dynamo (developers without it).
SKIP_DYNAMO_ENV = "SHADOW_PROXY_SKIP_DYNAMO"


def require_dynamo() -> Path:
    """The Dynamo venv's Python, for tests marked ``dynamo``.

    Dynamo missing is a failure, not a skip: ``make test`` installs it (``make
    dynamo``), so a missing install in CI is a broken pipeline, not a reason to
    pass silently. Outside CI, ``SHADOW_PROXY_SKIP_DYNAMO=1`` skips these tests;
    under ``CI=true`` that variable is ignored.
    """
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if os.environ.get(SKIP_DYNAMO_ENV) == "1" and not in_ci:
        pytest.skip(f"{SKIP_DYNAMO_ENV}=1")
    try:
        return dynamo_python()
    except DynamoUnavailable as e:
        hint = "" if in_ci else f" (or set {SKIP_DYNAMO_ENV}=1 to skip the Dynamo tests)"
        pytest.fail(f"{e}{hint}", pytrace=False)


@contextlib.asynccontextmanager
async def dynamo_with_mockers(scratch: Path, speedup: float) -> AsyncIterator[Dynamo]:
    """The real Dynamo frontend serving a ``deepseek`` and a ``chatml`` mocker on
    the local model directories (built here if ``make models`` has not run);
    stopped on the way out. Fails (or skips) as ``require_dynamo`` says."""
    require_dynamo()
    from shadow_proxy.devtools.modeldirs import build_all

    build_all(MODELS_DIR)
    dynamo = await start_dynamo(MODELS_DIR / "deepseek", "deepseek", scratch, speedup=speedup)
    try:
        await dynamo.add_mocker(MODELS_DIR / "chatml", "chatml", speedup=speedup)
        yield dynamo
    finally:
        await dynamo.aclose()
