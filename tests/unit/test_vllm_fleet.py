"""The vLLM fleet's start queue (``tests/support/vllm.py``): each server once,
and the one a test waits for first."""

from __future__ import annotations

from tests.support.vllm import queued


def test_each_name_once() -> None:
    # ready("llama-other") queues it with the session's wanted list, which names it too.
    names = ["llama-other", "llama", "llama-tools", "llama-other"]
    assert queued([], {}, names, "llama-other") == ["llama-other", "llama", "llama-tools"]


def test_started_and_queued_names_are_not_queued_again() -> None:
    assert queued(["llama-tools"], {"llama": 1}, ["llama", "llama-tools", "llama-other"], None) == [
        "llama-tools",
        "llama-other",
    ]


def test_the_awaited_name_starts_next() -> None:
    assert queued(["llama", "llama-tools", "llama-other"], {}, ["llama-other"], "llama-other") == [
        "llama-other",
        "llama",
        "llama-tools",
    ]


def test_a_started_name_stays_out() -> None:
    assert queued(["llama-tools"], {"llama-other": 1}, ["llama-other"], "llama-other") == [
        "llama-tools"
    ]
