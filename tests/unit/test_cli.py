"""``shadow-proxy --help`` (issue 17 item 13): whole sentences, every command."""

from __future__ import annotations

import subprocess
import sys


def test_help_is_complete():
    result = subprocess.run(
        [sys.executable, "-m", "shadow_proxy.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "A reverse-proxy sidecar for OpenAI-compatible LLM frontends: it forwards" in text
    assert "publishes each request, as the engine sees it, on taps." in text
    for command in ("serve", "mock-frontend", "consumer", "bench", "demo"):
        assert command in text
    # No sentence cut off: every paragraph of the description and epilog ends with a period.
    description = result.stdout.split("\n\n")[1]
    assert description.rstrip().endswith(".")
    assert "exits with status 2" in text
