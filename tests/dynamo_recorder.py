"""A recording Dynamo backend: the real 1.6.1 frontend in front of a worker that
writes every PreprocessedRequest it receives to a JSON-lines file and answers
one token. What the frontend hands its engine, as ground truth for tests.

Run as a script in the Dynamo venv (``python tests/dynamo_recorder.py MODEL_DIR
NAME OUT.jsonl``); ``start_recorder`` starts it with a frontend, as
``devtools.dynamo.start_dynamo`` starts the mocker. No pytest import here.
"""

from __future__ import annotations

import sys
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


async def start_recorder(model_dir: Path, served_name: str, scratch: Path, out: Path):
    """The frontend and the recording worker, ready (``devtools.dynamo``); a
    ``Dynamo`` to stop."""
    from shadow_proxy.devtools.dynamo import start_frontend

    dynamo = await start_frontend(served_name, scratch)
    argv = [str(dynamo.python), __file__, str(Path(model_dir).resolve()), served_name, str(out)]
    try:
        await dynamo.add_engine("recorder", argv, served_name, ready_timeout=90)
    except BaseException:
        await dynamo.aclose(timeout=5)
        raise
    return dynamo


if __name__ == "__main__":
    _serve()
