"""The request headers that change the engine's input: the allow-list both
processes share, and its frame in the hand-off. Pure.

Dynamo 1.6.1's HTTP service reads these into the preprocessed request
(``agent_context``, ``image_cache_scope``, ``routing``, the cache salt); the
serving loop copies them, and only them, into the request's ``q`` message
(``pick``: a pass over the raw header bytes, lowercased names, no decoding),
and the worker reads them back (``unpack``). Nothing else a client sends in a
header (``Authorization``, cookies, API keys above all) ever leaves the
serving process.

Exact names, and two prefixes Dynamo captures as agent headers
(``x-claude-code-*``, ``x-codex-*``). A name in those families that looks
like a credential (``auth``, ``key``, ``token``, ``secret``, ``password``,
``cookie`` in it) is never copied, even where Dynamo would capture it.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Session and agent headers (``agent_context``, ``image_cache_scope``).
SESSION_HEADERS = frozenset(
    {
        b"x-dynamo-session-id",
        b"x-dynamo-parent-session-id",
        b"x-dynamo-session-final",
        b"thread-id",
        b"session-id",
        b"x-session-id",
        b"x-parent-session-id",
        b"x-openai-subagent",
        b"x-openai-memgen-request",
    }
)
#: Routing headers (worker pins, priorities) and the tenant (cache salt).
ROUTING_HEADERS = frozenset(
    {
        b"x-dynamo-worker-instance-id",
        b"x-worker-instance-id",
        b"x-dynamo-prefill-instance-id",
        b"x-prefill-instance-id",
        b"x-dynamo-dp-rank",
        b"x-dp-rank",
        b"x-data-parallel-rank",
        b"x-dynamo-prefill-dp-rank",
        b"x-prefill-dp-rank",
        b"x-dynamo-request-priority",
        b"x-dynamo-request-strict-priority",
        b"x-tenant-id",
    }
)
ENGINE_HEADERS = SESSION_HEADERS | ROUTING_HEADERS
AGENT_PREFIXES = (b"x-claude-code-", b"x-codex-")
#: Never copied, whatever the family.
CREDENTIAL_WORDS = (b"auth", b"key", b"token", b"secret", b"password", b"cookie")
#: At most this many bytes of headers per request go into the hand-off.
MAX_HEADER_BYTES = 64 * 1024


def allowed(name: bytes) -> bool:
    """Whether a lowercased header name is on the allow-list."""
    if name in ENGINE_HEADERS:
        return True
    return name.startswith(AGENT_PREFIXES) and not any(w in name for w in CREDENTIAL_WORDS)


def pick(raw_headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The allowed headers of a request as one frame: ``name:value\\n`` per
    header, in arrival order, names lowercased, at most ``MAX_HEADER_BYTES``
    (what does not fit is left out)."""
    out = []
    size = 0
    for name, value in raw_headers:
        lower = name.lower()
        if allowed(lower):
            size += len(lower) + len(value) + 2
            if size > MAX_HEADER_BYTES:
                break
            out.append(lower + b":" + value + b"\n")
    return b"".join(out)


def unpack(frame: bytes) -> list[tuple[str, str]]:
    """``(name, value)`` pairs from ``pick``'s frame; values that are not UTF-8
    are left out (Dynamo skips them), names failing the allow-list too."""
    pairs = []
    for line in frame.split(b"\n"):
        name, sep, value = line.partition(b":")
        if not sep or not allowed(name):
            continue
        try:
            pairs.append((name.decode("ascii"), value.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return pairs


#: The headers that name a conversation, in the order one is picked: the
#: worker keeps a conversation's requests on one shard (its segment cache holds
#: the turns before).
CONVERSATION_HEADERS = (b"x-dynamo-session-id", b"x-session-id", b"session-id", b"thread-id")


def conversation(frame: bytes) -> bytes | None:
    """The conversation id in ``pick``'s frame (the first of
    ``CONVERSATION_HEADERS`` present with a value), or None."""
    found: dict[bytes, bytes] = {}
    for line in frame.split(b"\n"):
        name, sep, value = line.partition(b":")
        if sep and value and name in CONVERSATION_HEADERS:
            found.setdefault(name, value)
    for name in CONVERSATION_HEADERS:
        if name in found:
            return found[name]
    return None
