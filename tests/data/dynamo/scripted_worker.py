"""A Dynamo 1.6.1 backend that answers every request with one fixed text and
writes down each preprocessed request it receives (runs in the Dynamo venv).

    python scripted_worker.py MODEL_DIR SERVED_NAME COMPONENT TEXT REQUESTS.jsonl

The frontend preprocesses as for any worker (``ModelInput.Tokens``: the
frontend renders and tokenizes), so ``REQUESTS.jsonl`` holds exactly what the
engine gets, one JSON line per request; the answer is ``TEXT``'s token ids, one
per chunk, ending with ``finish_reason: stop`` (or ``length`` at the request's
``max_tokens``). With ``tool_choice: required`` and a text that is a JSON array
of calls, the frontend turns the answer into function calls: the only way to
see Dynamo's function-call events without a model.
"""

from __future__ import annotations

import json
import sys

import uvloop
from dynamo.common.utils.runtime import create_runtime
from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
from tokenizers import Tokenizer


async def main() -> None:
    model_dir, name, component, text, out_path = sys.argv[1:6]
    ids = Tokenizer.from_file(f"{model_dir}/tokenizer.json").encode(text, add_special_tokens=False)
    answer = ids.ids
    runtime, _loop = create_runtime("file", "tcp", "zmq")
    endpoint = runtime.endpoint(f"dynamo.{component}.generate")
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        model_dir,
        name,
        worker_type=WorkerType.Aggregated,
    )
    out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115 (lives as long as the process)

    async def generate(request, context=None):
        out.write(json.dumps(request, ensure_ascii=False) + "\n")
        out.flush()
        limit = (request.get("stop_conditions") or {}).get("max_tokens") or len(answer)
        count = min(limit, len(answer))
        for i in range(count):
            last = i == count - 1
            reason = ("stop" if count == len(answer) else "length") if last else None
            yield {"token_ids": [answer[i]], **({"finish_reason": reason} if reason else {})}

    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    uvloop.run(main())
