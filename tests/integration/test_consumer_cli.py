"""``shadow-consumer`` as a process: SIGTERM prints the summary and exits 0."""

from __future__ import annotations

import contextlib
import json
import sys

from shadow_proxy.devtools.processes import Child
from tests.support import ROOT
from tests.support.tap_messages import TOPIC, publish_until, publisher


class TestSigterm:
    """The summary goes to stdout on SIGTERM; the exit status is 0."""

    def test_sigterm_prints_summary_and_exits_0(self, tmp_path):
        summary_path = tmp_path / "summary.json"
        with publisher() as (sock, endpoint):
            argv = [
                *(sys.executable, "-m", "shadow_proxy.consumer.main", "--endpoint", endpoint),
                *("--topic", TOPIC, "--interval", "0.05", "--summary-path", str(summary_path)),
            ]
            with Child("consumer", argv, tmp_path, cwd=ROOT) as child:

                def some_records() -> bool:
                    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                        return json.loads(summary_path.read_text())["records"] >= 3
                    return False

                publish_until(sock, some_records, timeout=20)
                assert child.terminate(10) == 0
        summary = json.loads(child.read_output())
        assert summary["records"] >= 3
        assert summary["topic"] == TOPIC
