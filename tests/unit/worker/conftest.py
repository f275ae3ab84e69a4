"""The two real tokenizers as the worker loads them, and a preprocessor over both."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model


@pytest.fixture(scope="session")
def loaded(model_dirs: dict[str, Path]) -> dict:
    # These cases compare with transformers' apply_chat_template: jinja2's view.
    # Dynamo's MiniJinja view is tested in tests/unit/worker/request/templates/.
    return {
        name: load_model(name, str(path), None, template_engine="jinja2")
        for name, path in model_dirs.items()
    }


@pytest.fixture(scope="session")
def preprocessor(loaded: dict) -> Preprocessor:
    return Preprocessor(loaded)
