"""Who is asking, as Dynamo 1.6.1 reads it: ``agent_context`` and
``image_cache_scope`` from the session headers, routing overrides and the
tenant's cache salt from the routing headers. Pure.

Input: the allow-listed request headers (``channel.headers``), lowercased
names, in arrival order. Rules, as measured on the 1.6.1 frontend:

- session id: ``x-dynamo-session-id`` first (with ``x-dynamo-parent-session-id``);
  else the agent families in order: Claude Code (``x-claude-code-session-id``
  is the root; ``x-claude-code-agent-id`` a child whose parent is
  ``x-claude-code-parent-agent-id`` or else the root), Codex (``thread-id``,
  ``x-codex-parent-thread-id``), OpenCode (``x-session-id``,
  ``x-parent-session-id``). Values are trimmed, blank means absent; a parent
  equal to the session is dropped. ``x-dynamo-session-final`` is a boolean
  (``true/false/1/0/yes/no/on/off``), absent when unparseable.
- ``agent_headers``: every ``x-claude-code-*``, ``x-codex-*``, ``thread-id``,
  ``x-openai-subagent``, ``x-openai-memgen-request``, ``x-session-id``,
  ``x-parent-session-id`` (and ``session-id`` when ``thread-id`` is usable),
  name -> raw values in order, names sorted, at most 64 values, 16 KiB a value,
  32 KiB in all; only when a session id was found.
- ``input_trigger``: chat whose last message is from the user ``user_message``,
  from a tool ``tool_result``, else (and completions) ``other``.
- ``image_cache_scope``: the session id.
- routing headers override ``nvext``: worker and prefill instance ids, data
  parallel ranks (``u32::MAX`` = unset), priority (i32, also ``priority_jump``)
  and strict priority (u32); ``x-tenant-id`` (trimmed, blank ignored) is the
  cache salt, before ``nvext.cache_salt`` and the top-level ``cache_salt``.
"""

from __future__ import annotations

import re
from typing import Any

_ROOT_FAMILIES = (
    # (root session header, child header, parent header, infer parent for a child)
    ("x-claude-code-session-id", "x-claude-code-agent-id", "x-claude-code-parent-agent-id", True),
    ("thread-id", None, "x-codex-parent-thread-id", False),
    ("x-session-id", None, "x-parent-session-id", False),
)
_AGENT_NAMES = frozenset(
    {
        "session-id",
        "thread-id",
        "x-openai-subagent",
        "x-openai-memgen-request",
        "x-session-id",
        "x-parent-session-id",
    }
)
_TRUE = frozenset({"true", "1", "yes", "on", "y", "t"})
_FALSE = frozenset({"false", "0", "no", "off", "n", "f"})
_UNSIGNED = re.compile(r"\+?[0-9]+")
_SIGNED = re.compile(r"[+-]?[0-9]+")
MAX_AGENT_VALUES = 64
MAX_AGENT_VALUE_BYTES = 16 * 1024
MAX_AGENT_BYTES = 32 * 1024
_U32, _U64, _I32 = 2**32, 2**64, 2**31


class Headers:
    """Header lookups with HTTP's first-value semantics."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs
        self.first: dict[str, str] = {}
        for name, value in pairs:
            self.first.setdefault(name, value)

    def value(self, name: str | None) -> str | None:
        """The trimmed first value, None when absent or blank."""
        if name is None:
            return None
        value = self.first.get(name, "").strip()
        return value or None

    def number(self, names: tuple[str, ...], signed: bool, end: int) -> int | None:
        for name in names:
            raw = self.first.get(name)
            if raw is None:
                continue
            if not (_SIGNED if signed else _UNSIGNED).fullmatch(raw):
                return None
            value = int(raw)
            return value if (-end if signed else 0) <= value < end else None
        return None


def _session(headers: Headers) -> tuple[str, str | None] | None:
    session = headers.value("x-dynamo-session-id")
    if session is not None:
        parent = headers.value("x-dynamo-parent-session-id")
        return session, None if parent == session else parent
    for root_name, child_name, parent_name, infer in _ROOT_FAMILIES:
        root = headers.value(root_name)
        if root is None:
            continue
        session = headers.value(child_name) or root
        parent = headers.value(parent_name)
        if parent == session or (infer and session == root):
            parent = None
        if parent is None and infer and session != root:
            parent = root
        return session, parent
    return None


def _agent_headers(headers: Headers) -> dict[str, list[str]]:
    captured: dict[str, list[str]] = {}
    count = size = 0
    thread_usable = headers.value("thread-id") is not None
    for name, value in headers.pairs:
        family = name.startswith(("x-claude-code-", "x-codex-")) or name in _AGENT_NAMES
        if not family or (name == "session-id" and not thread_usable):
            continue
        value_bytes = len(value.encode("utf-8"))
        grown = size + len(name) + value_bytes
        if (
            value_bytes > MAX_AGENT_VALUE_BYTES
            or count >= MAX_AGENT_VALUES
            or grown > MAX_AGENT_BYTES
        ):
            continue
        captured.setdefault(name, []).append(value)
        count += 1
        size = grown
    return dict(sorted(captured.items()))


def input_trigger(request: dict, *, chat: bool) -> str:
    messages = request.get("messages") if chat else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    role = last.get("role") if isinstance(last, dict) else None
    if role == "user":
        return "user_message"
    if role in ("tool", "function"):
        return "tool_result"
    return "other"


def agent_context(headers: Headers, request: dict, *, chat: bool) -> dict[str, Any]:
    """Dynamo's ``agent_context``, empty when no session header is present."""
    found = _session(headers)
    if found is None:
        return {}
    session, parent = found
    context: dict[str, Any] = {"session_id": session}
    if parent is not None:
        context["parent_session_id"] = parent
    final = headers.value("x-dynamo-session-final")
    if final is not None and final.lower() in _TRUE | _FALSE:
        context["session_final"] = final.lower() in _TRUE
    captured = _agent_headers(headers)
    if captured:
        context["agent_headers"] = captured
    context["input_trigger"] = input_trigger(request, chat=chat)
    return context


def routing_overrides(headers: Headers) -> dict[str, Any]:
    """``nvext`` fields the routing headers set (they win over the body's)."""
    out: dict[str, Any] = {}
    worker = headers.number(("x-dynamo-worker-instance-id", "x-worker-instance-id"), False, _U64)
    if worker is not None:
        out["backend_instance_id"] = out["decode_worker_id"] = worker
    prefill = headers.number(("x-dynamo-prefill-instance-id", "x-prefill-instance-id"), False, _U64)
    if prefill is not None:
        out["prefill_worker_id"] = prefill
    rank = headers.number(("x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"), False, _U32)
    if rank is not None:
        out["dp_rank"] = rank
    prefill_rank = headers.number(("x-dynamo-prefill-dp-rank", "x-prefill-dp-rank"), False, _U32)
    if prefill_rank is not None and prefill_rank != _U32 - 1:
        out["prefill_dp_rank"] = prefill_rank
    hints = {}
    priority = headers.number(("x-dynamo-request-priority",), True, _I32)
    if priority is not None:
        hints["priority"] = priority
    strict = headers.number(("x-dynamo-request-strict-priority",), False, _U32)
    if strict is not None:
        hints["strict_priority"] = strict
    if hints:
        out["agent_hints"] = hints
    tenant = headers.value("x-tenant-id")
    if tenant is not None:
        out["cache_salt"] = tenant
    return out
