"""Re-capture the Dynamo 1.6.1 SSE fixtures in this folder (exact response body bytes).

    .venv/bin/python -m tests.data.dynamo.capture

Needs .dynamo/venv (scripts/install-dynamo.sh). Writes:
- chat_stream_usage.sse: streaming chat with stream_options.include_usage
- completions_stream_usage.sse: streaming completions with include_usage
- chat_stream_mocker_killed.sse: streaming chat; the mocker is SIGKILLed after
  a few chunks; the frontend ends the 200 stream with an error event + [DONE]
- *.meta.json: the request, the response status and headers
Ids and "created" differ on every capture; the structure does not.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from shadow_proxy.devtools.dynamo import REPO, start_dynamo

HERE = Path(__file__).resolve().parent


def stream(port: int, path: str, body: dict, *, on_chunks=None, kill_after: int = 0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    resp = conn.getresponse()
    out = b""
    killed = False
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        out += chunk
        if kill_after and not killed and out.count(b"\n\ndata: ") >= kill_after:
            on_chunks()
            killed = True
    meta = {
        "request": {"path": path, "body": body},
        "status": resp.status,
        "headers": [[k, v] for k, v in resp.getheaders() if k.lower() != "date"],
    }
    conn.close()
    return out, meta


def save(name: str, raw: bytes, meta: dict) -> None:
    (HERE / f"{name}.sse").write_bytes(raw)
    (HERE / f"{name}.meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print(f"{name}.sse: {len(raw)} bytes, {raw.count(b'data: ')} data lines")


async def main() -> None:
    model = REPO / ".models" / "deepseek"
    with tempfile.TemporaryDirectory() as tmp:
        d = await start_dynamo(model, "deepseek", Path(tmp) / "a", speedup=1000)
        port = urlsplit(d.base_url).port
        try:
            save(
                "chat_stream_usage",
                *stream(
                    port,
                    "/v1/chat/completions",
                    {
                        "model": "deepseek",
                        "max_tokens": 6,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [
                            {"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Say hello in French 🙂"},
                        ],
                    },
                ),
            )
            save(
                "completions_stream_usage",
                *stream(
                    port,
                    "/v1/completions",
                    {
                        "model": "deepseek",
                        "max_tokens": 6,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        "prompt": "Once upon a time",
                    },
                ),
            )
        finally:
            await d.aclose()
        # Slow mocker so that the stream is still running when the mocker dies.
        d = await start_dynamo(model, "deepseek", Path(tmp) / "b", speedup=0.2)
        port = urlsplit(d.base_url).port
        try:
            save(
                "chat_stream_mocker_killed",
                *stream(
                    port,
                    "/v1/chat/completions",
                    {
                        "model": "deepseek",
                        "max_tokens": 500,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": "Tell me a long story."}],
                    },
                    on_chunks=d.kill_mocker,
                    kill_after=4,
                ),
            )
        finally:
            await d.aclose()


if __name__ == "__main__":
    asyncio.run(main())
