"""agent_context, image_cache_scope, routing overrides and the cache salt from the
allow-listed headers, as measured on Dynamo 1.6.1 (recording backend)."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request.identity import (
    MAX_AGENT_VALUE_BYTES,
    MAX_AGENT_VALUES,
    Headers,
    agent_context,
    input_trigger,
    routing_overrides,
)

USER = {"messages": [{"role": "user", "content": "q"}]}


def context(pairs: list[tuple[str, str]], request: dict = USER, chat: bool = True) -> dict:
    return agent_context(Headers(pairs), request, chat=chat)


class TestSession:
    """Which header gives the session and the parent."""

    def test_dynamo_session_trimmed_and_first(self) -> None:
        got = context([("x-claude-code-session-id", "cc"), ("x-dynamo-session-id", "  s ")])
        assert got["session_id"] == "s"
        assert list(got) == ["session_id", "agent_headers", "input_trigger"]

    def test_parent_equal_to_session_dropped(self) -> None:
        got = context([("x-dynamo-session-id", "s"), ("x-dynamo-parent-session-id", "s")])
        assert "parent_session_id" not in got
        got = context([("x-dynamo-session-id", "s"), ("x-dynamo-parent-session-id", " p ")])
        assert got["parent_session_id"] == "p"

    def test_blank_session_is_absent(self) -> None:
        assert context([("x-dynamo-session-id", "  ")]) == {}
        assert context([("x-tenant-id", "t")]) == {}

    def test_claude_code_child_and_root(self) -> None:
        root = context([("x-claude-code-session-id", "root")])
        assert (root["session_id"], "parent_session_id" in root) == ("root", False)
        child = context([("x-claude-code-session-id", "root"), ("x-claude-code-agent-id", "kid")])
        assert (child["session_id"], child["parent_session_id"]) == ("kid", "root")
        explicit = context(
            [
                ("x-claude-code-session-id", "root"),
                ("x-claude-code-agent-id", "kid"),
                ("x-claude-code-parent-agent-id", "mid"),
            ]
        )
        assert explicit["parent_session_id"] == "mid"
        # a parent header without a child is not used (the root is the session)
        rootp = context([("x-claude-code-session-id", "r"), ("x-claude-code-parent-agent-id", "m")])
        assert "parent_session_id" not in rootp

    @pytest.mark.parametrize(
        ("pairs", "session", "parent"),
        [
            ([("thread-id", "t"), ("x-codex-parent-thread-id", "tp")], "t", "tp"),
            ([("x-session-id", "o"), ("x-parent-session-id", "op")], "o", "op"),
        ],
    )
    def test_codex_and_opencode(self, pairs: list, session: str, parent: str) -> None:
        got = context(pairs)
        assert (got["session_id"], got["parent_session_id"]) == (session, parent)

    @pytest.mark.parametrize(
        ("value", "want"), [("true", True), ("FALSE", False), ("1", True), ("off", False)]
    )
    def test_session_final(self, value: str, want: bool) -> None:
        got = context([("x-dynamo-session-id", "s"), ("x-dynamo-session-final", value)])
        assert got["session_final"] is want

    def test_session_final_unparseable_is_absent(self) -> None:
        got = context([("x-dynamo-session-id", "s"), ("x-dynamo-session-final", "maybe")])
        assert "session_final" not in got


class TestAgentHeaders:
    """Raw values of the agent families, sorted by name, bounded."""

    def test_families_order_and_raw_values(self) -> None:
        got = context(
            [
                ("x-codex-z", " raw "),
                ("x-claude-code-session-id", "cc"),
                ("x-codex-z", ""),
                ("session-id", "ignored without thread-id"),
                ("x-openai-subagent", "yes"),
                ("x-dynamo-session-id", "s"),
            ]
        )
        assert got["agent_headers"] == {
            "x-claude-code-session-id": ["cc"],
            "x-codex-z": [" raw ", ""],
            "x-openai-subagent": ["yes"],
        }
        with_thread = context([("thread-id", "t"), ("session-id", "x")])
        assert with_thread["agent_headers"] == {"session-id": ["x"], "thread-id": ["t"]}

    def test_caps(self) -> None:
        pairs = [("x-dynamo-session-id", "s"), ("x-codex-big", "x" * (MAX_AGENT_VALUE_BYTES + 1))]
        pairs += [("x-codex-many", "v")] * (MAX_AGENT_VALUES + 5)
        got = context(pairs)
        assert "x-codex-big" not in got["agent_headers"]
        assert len(got["agent_headers"]["x-codex-many"]) == MAX_AGENT_VALUES


class TestInputTrigger:
    @pytest.mark.parametrize(
        ("role", "want"),
        [("user", "user_message"), ("tool", "tool_result"), ("assistant", "other")],
    )
    def test_last_message(self, role: str, want: str) -> None:
        request = {"messages": [{"role": "user", "content": "a"}, {"role": role, "content": "b"}]}
        assert input_trigger(request, chat=True) == want

    def test_completions_other(self) -> None:
        assert context([("x-session-id", "o")], {"prompt": "x"}, chat=False)["input_trigger"] == (
            "other"
        )


class TestRoutingOverrides:
    def test_all(self) -> None:
        got = routing_overrides(
            Headers(
                [
                    ("x-worker-instance-id", "12"),
                    ("x-dynamo-prefill-instance-id", "13"),
                    ("x-data-parallel-rank", "2"),
                    ("x-dynamo-prefill-dp-rank", "4294967295"),
                    ("x-dynamo-request-priority", "-3"),
                    ("x-dynamo-request-strict-priority", "1"),
                    ("x-tenant-id", " t "),
                ]
            )
        )
        assert got == {
            "backend_instance_id": 12,
            "decode_worker_id": 12,
            "prefill_worker_id": 13,
            "dp_rank": 2,
            "agent_hints": {"priority": -3, "strict_priority": 1},
            "cache_salt": "t",
        }

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("x-dynamo-request-priority", "2.5"),
            ("x-dynamo-request-priority", "abc"),
            ("x-dynamo-request-strict-priority", "true"),
            ("x-dynamo-worker-instance-id", "-1"),
            ("x-dynamo-dp-rank", str(2**32)),
            ("x-tenant-id", "   "),
        ],
    )
    def test_unparseable_ignored(self, name: str, value: str) -> None:
        assert routing_overrides(Headers([(name, value)])) == {}
