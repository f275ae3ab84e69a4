"""The choices keep the strings of the file, the records and the metrics."""

from __future__ import annotations

from shadow_proxy.config.choices import (
    TEMPLATE_ENGINES,
    Capture,
    Priority,
    SampleBy,
    Transport,
)


def test_values_are_the_files_strings() -> None:
    assert [str(c) for c in Capture] == ["request", "request_response"]
    assert (Transport.NATS == "nats", f"{Priority.IDLE}") == (True, "idle")
    assert SampleBy("prefix") is SampleBy.PREFIX
    assert TEMPLATE_ENGINES == ("minijinja", "jinja2")
