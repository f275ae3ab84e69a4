"""A recording Dynamo backend: the real 1.6.1 frontend in front of a worker that
writes every PreprocessedRequest it receives to a JSON-lines file and answers
one token. What the frontend hands its engine, as ground truth for tests.

Run as a script in the Dynamo venv (``python tests/dynamo_recorder.py MODEL_DIR
NAME OUT.jsonl``); ``start_recorder`` starts it with a frontend, as
``dynamo_harness.start_dynamo`` starts the mocker. No pytest import here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _serve() -> None:  # in the Dynamo venv
    import json

    import uvloop
    from dynamo.common.utils.runtime import create_runtime
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    model_path, name, out = sys.argv[1:4]

    async def main() -> None:
        runtime, _loop = create_runtime("file", "tcp", "zmq")
        endpoint = runtime.endpoint("dynamo.recorder.generate")
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat | ModelType.Completions,
            endpoint,
            model_path,
            name,
            worker_type=WorkerType.Aggregated,
        )
        sink = open(out, "a", encoding="utf-8")  # noqa: SIM115

        async def generate(request, context=None):
            sink.write(json.dumps(request, ensure_ascii=False) + "\n")
            sink.flush()
            yield {"token_ids": [5], "finish_reason": "stop"}

        await endpoint.serve_endpoint(generate)

    uvloop.run(main())


def start_recorder(model_dir: Path, served_name: str, scratch: Path, out: Path):
    """The frontend and the recording worker, ready; a ``DynamoProcs`` to stop."""
    import subprocess

    from tests import dynamo_harness as h

    py = h.dynamo_python()
    scratch.mkdir(parents=True, exist_ok=True)
    env = h.dynamo_env(scratch)
    port = h.free_port()
    common = {"env": env, "cwd": str(scratch), "stdin": subprocess.DEVNULL,
              "start_new_session": True, "stderr": subprocess.STDOUT}  # fmt: skip
    worker_log, frontend_log = scratch / "recorder.log", scratch / "frontend.log"
    wlog, flog = open(worker_log, "wb"), open(frontend_log, "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        [str(py), __file__, str(Path(model_dir).resolve()), served_name, str(out)],
        stdout=wlog,
        **common,
    )
    frontend = subprocess.Popen(
        [str(py), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)],
        stdout=flog,
        **common,
    )
    procs = h.DynamoProcs(
        worker, frontend, f"http://127.0.0.1:{port}", port, served_name, scratch,
        worker_log, frontend_log, _logs=[wlog, flog],
    )  # fmt: skip
    try:
        h._wait_ready(procs, time.monotonic() + 90)
    except BaseException:
        procs.stop(timeout=5)
        raise
    return procs


if __name__ == "__main__":
    _serve()
