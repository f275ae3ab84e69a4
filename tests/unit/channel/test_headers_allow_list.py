"""The engine-header allow-list: what the serving loop copies into the hand-off."""

from __future__ import annotations

import pytest

from shadow_proxy.channel import headers
from shadow_proxy.channel.headers import MAX_HEADER_BYTES, allowed, pick, unpack


class TestAllowList:
    @pytest.mark.parametrize(
        "name",
        [
            b"x-dynamo-session-id",
            b"thread-id",
            b"x-tenant-id",
            b"x-dp-rank",
            b"x-claude-code-agent-id",
            b"x-codex-anything",
        ],
    )
    def test_allowed(self, name: bytes) -> None:
        assert allowed(name)

    @pytest.mark.parametrize(
        "name",
        [
            b"authorization",
            b"proxy-authorization",
            b"cookie",
            b"x-api-key",
            b"api-key",
            b"x-codex-api-key",
            b"x-claude-code-oauth-token",
            b"x-codex-secret",
            b"x-request-id",
            b"content-type",
            b"x-session",
        ],
    )
    def test_refused(self, name: bytes) -> None:
        assert not allowed(name)

    def test_pick_and_unpack(self) -> None:
        raw = [
            (b"Authorization", b"Bearer sk-1"),
            (b"X-Dynamo-Session-Id", b" s "),
            (b"x-codex-note", b"\xff\xfe"),  # not UTF-8: left out, as Dynamo does
            (b"x-codex-note", b"ok:with:colons"),
        ]
        frame = pick(raw)
        assert b"sk-1" not in frame
        assert unpack(frame) == [("x-dynamo-session-id", " s "), ("x-codex-note", "ok:with:colons")]

    def test_bounded(self) -> None:
        raw = [(b"x-codex-big", b"v" * 1024)] * 200
        assert len(pick(raw)) <= MAX_HEADER_BYTES

    def test_unpack_refuses_names_off_the_list(self) -> None:
        assert unpack(b"authorization:Bearer x\nx-tenant-id:t\n") == [("x-tenant-id", "t")]


class TestConversation:
    """The id the worker keeps a conversation's requests together by."""

    def test_first_of_the_family_in_order(self):
        frame = b"session-id:b\nx-dynamo-session-id:a\nx-tenant-id:t\n"
        assert headers.conversation(frame) == b"a"
        assert headers.conversation(b"thread-id:c\nx-session-id:d\n") == b"d"
        assert headers.conversation(b"thread-id:c\n") == b"c"

    def test_none_without_one_or_with_an_empty_value(self):
        assert headers.conversation(b"") is None
        assert headers.conversation(b"x-tenant-id:t\n") is None
        assert headers.conversation(b"x-dynamo-session-id:\n") is None
