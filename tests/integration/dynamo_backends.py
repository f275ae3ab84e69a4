"""More Dynamo backends behind a running test frontend: the scripted worker.

No pytest import (used by fixtures and by ``tests/data/dynamo/capture_responses.py``).
``start_scripted_worker`` starts ``tests/data/dynamo/scripted_worker.py`` (a
backend answering one fixed text and writing down every preprocessed request it
gets) behind the frontend of a ``Dynamo`` (``devtools/dynamo.py``); it is
stopped with the others (``Dynamo.stop``).
"""

from __future__ import annotations

import json
from pathlib import Path

from shadow_proxy.devtools.dynamo import Dynamo
from shadow_proxy.devtools.processes import Child

SCRIPTED_WORKER = Path(__file__).resolve().parent.parent / "data" / "dynamo" / "scripted_worker.py"


async def start_scripted_worker(
    dynamo: Dynamo,
    model_dir: Path,
    served_name: str,
    text: str,
    requests_path: Path,
    *,
    ready_timeout: float = 60.0,
) -> Child:
    """Serve ``served_name`` (tokenizer and template of ``model_dir``) with the
    scripted worker answering ``text``; its engine requests go to ``requests_path``.
    Returns once the frontend serves a request for it (``Dynamo.add_engine``)."""
    component = "".join(c for c in served_name if c.isalnum())
    argv = [
        str(dynamo.python),
        str(SCRIPTED_WORKER),
        str(Path(model_dir).resolve()),
        served_name,
        component,
        text,
        str(requests_path),
    ]
    return await dynamo.add_engine(f"worker-{component}", argv, served_name, ready_timeout)


def read_requests(path: Path) -> list[dict]:
    """The engine requests the scripted worker wrote down, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
