"""More Dynamo backends behind a running test frontend: the scripted worker.

No pytest import (used by fixtures and by ``tests/data/dynamo/capture_responses.py``).
``start_scripted_worker`` starts ``tests/data/dynamo/scripted_worker.py`` (a
backend answering one fixed text and writing down every preprocessed request it
gets) behind the frontend of a ``DynamoProcs``; it is stopped with the others
(``DynamoProcs.stop``).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.dynamo_harness import DynamoProcs, DynamoStartError, dynamo_env, dynamo_python

SCRIPTED_WORKER = Path(__file__).resolve().parent.parent / "data" / "dynamo" / "scripted_worker.py"


def start_scripted_worker(
    procs: DynamoProcs,
    model_dir: Path,
    served_name: str,
    text: str,
    requests_path: Path,
    *,
    ready_timeout: float = 60.0,
) -> subprocess.Popen[bytes]:
    """Serve ``served_name`` (tokenizer and template of ``model_dir``) with the
    scripted worker answering ``text``; its engine requests go to ``requests_path``.
    Waits until the frontend serves a request for it."""
    component = "".join(c for c in served_name if c.isalnum())
    log = open(procs.scratch / f"worker-{component}.log", "wb")  # noqa: SIM115
    procs._logs.append(log)
    worker = subprocess.Popen(
        [
            str(dynamo_python()),
            str(SCRIPTED_WORKER),
            str(Path(model_dir).resolve()),
            served_name,
            component,
            text,
            str(requests_path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dynamo_env(procs.scratch),
        cwd=str(procs.scratch),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    procs.extra_mockers.append(worker)
    probe = json.dumps(
        {"model": served_name, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    ).encode()
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            msg = f"scripted worker exited with {worker.returncode}\n{procs.logs_tail()}"
            raise DynamoStartError(msg)
        request = urllib.request.Request(
            procs.base_url + "/v1/chat/completions",
            data=probe,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    response.read()
                    return worker
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    msg = f"scripted worker for {served_name!r} not served in time\n{procs.logs_tail()}"
    raise DynamoStartError(msg)


def read_requests(path: Path) -> list[dict]:
    """The engine requests the scripted worker wrote down, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
