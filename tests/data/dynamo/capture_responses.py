"""Re-capture the Dynamo 1.6.1 Responses and batch-completions fixtures (exact body bytes).

    .venv/bin/python tests/data/dynamo/capture_responses.py

Needs .dynamo/venv (scripts/install-dynamo.sh). One frontend, a mocker serving
``.models/deepseek`` as ``deepseek`` and the scripted worker
(``scripted_worker.py``) serving ``.models/chatml`` as ``scripted``, answering
a JSON array holding one call. Writes ``responses/*`` here:

- stream_incomplete.sse / unary_incomplete.json: the mocker runs to
  ``max_output_tokens`` (``response.incomplete``, ``max_output_tokens``);
- stream_failed.sse: no ``max_output_tokens``, the mocker refuses after the
  200 (``response.failed``);
- stream_completed.sse: the scripted answer as text, ended by the engine
  (``response.completed``);
- stream_function_call.sse / unary_function_call.json: the same answer with
  ``tool_choice: required``, parsed by the frontend into a function call;
- batch_stream.sse / batch_unary.json: completions with two prompts
  (interleaved chunks ``cmpl-<id>-<i>``, one summed usage);
- *.meta.json: the request, status and headers.
Ids and timestamps differ on every capture; the structure does not.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
from pathlib import Path

from shadow_proxy.devtools.dynamo import REPO, start_dynamo
from tests.integration.dynamo_backends import start_scripted_worker

HERE = Path(__file__).resolve().parent

OUT = HERE / "responses"
CALL_TEXT = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def post(port: int, path: str, body: dict) -> tuple[bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    meta = {
        "request": {"path": path, "body": body},
        "status": response.status,
        "headers": [[k, v] for k, v in response.getheaders() if k.lower() != "date"],
    }
    conn.close()
    return data, meta


def save(name: str, data: bytes, meta: dict) -> None:
    OUT.mkdir(exist_ok=True)
    stem = name.rsplit(".", 1)[0]
    (OUT / name).write_bytes(data)
    (OUT / f"{stem}.meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print(f"{name}: {meta['status']}, {len(data)} bytes")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        d = await start_dynamo(REPO / ".models" / "deepseek", "deepseek", scratch, speedup=100)
        try:
            await start_scripted_worker(
                d, REPO / ".models" / "chatml", "scripted", CALL_TEXT, scratch / "engine.jsonl"
            )
            port = d.http_port
            mocker = {
                "model": "deepseek",
                "input": "Tell me about shadows.",
                "max_output_tokens": 5,
            }
            save("stream_incomplete.sse", *post(port, "/v1/responses", {**mocker, "stream": True}))
            save("unary_incomplete.json", *post(port, "/v1/responses", mocker))
            failed = {"model": "deepseek", "input": "no limit", "stream": True}
            save("stream_failed.sse", *post(port, "/v1/responses", failed))
            scripted = {"model": "scripted", "input": "weather in Paris?", "max_output_tokens": 64}
            save("stream_completed.sse", *post(port, "/v1/responses", {**scripted, "stream": True}))
            call = {**scripted, "tools": [WEATHER], "tool_choice": "required"}
            save("stream_function_call.sse", *post(port, "/v1/responses", {**call, "stream": True}))
            save("unary_function_call.json", *post(port, "/v1/responses", call))
            batch = {"model": "deepseek", "prompt": ["alpha beta", "gamma delta epsilon"]}
            batch["max_tokens"] = 3
            stream = {**batch, "stream": True, "stream_options": {"include_usage": True}}
            save("batch_stream.sse", *post(port, "/v1/completions", stream))
            save("batch_unary.json", *post(port, "/v1/completions", batch))
        finally:
            await d.aclose()


if __name__ == "__main__":  # .venv/bin/python -m tests.data.dynamo.capture_responses
    asyncio.run(main())
