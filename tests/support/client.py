"""What a client sends through the proxy and checks in the answer, for the tests
that run the proxy's application: a chat body, a POST, a finished stream, a
metric sample from the proxy's registry."""

from __future__ import annotations


def chat_body(content: str = "Hello there", model: str = "deepseek", **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": 4,
        **extra,
    }


async def post(session, url, path="/v1/chat/completions", *, headers=None, **kw):
    async with session.post(url + path, headers=headers, **kw) as r:
        return r.status, r.headers.copy(), await r.read()


def assert_sse_done(status: int, body: bytes) -> None:
    assert status == 200, body[:200]
    assert body.startswith(b"data: "), body[:200]
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]


def sample(registry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0
