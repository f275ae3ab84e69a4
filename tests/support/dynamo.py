"""The rule for tests that need the real Dynamo (marker ``dynamo``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shadow_proxy.devtools.dynamo import DynamoUnavailable, dynamo_python

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
