"""``shadow-consumer`` as a process: SIGTERM prints the summary and exits 0."""

from __future__ import annotations

import contextlib
import json
import sys
import time

import zmq

from shadow_proxy.devtools.processes import Child
from shadow_proxy.records import envelope as records
from shadow_proxy.records import wire
from tests.support import ROOT

TOPIC = "shadow-requests-a"


def record_frames(
    seq: int,
    *,
    publisher: int = 1,
    transport: int | None = None,
    topic: str = TOPIC,
    tokens: int = 3,
    response: dict | None = None,
    **overrides,
) -> list[bytes]:
    envelope = records.build_envelope(
        tap="a",
        seq=seq,
        request_id=f"req-{seq}",
        origin="chat",
        filters=["strip-worker-pins"],
        arrival_unix_ns=1,
        sample_rate=1.0,
        request={"model": "m", "token_ids": list(range(tokens))},
        response=response,
    )
    envelope.update(overrides)
    payload = wire.encode_envelope(envelope)
    return wire.encode_frames(topic, publisher, seq if transport is None else transport, 0, payload)


@contextlib.contextmanager
def publisher():
    context = zmq.Context()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    try:
        yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        sock.close(linger=0)
        context.term()


def publish_until(sock, done, *, timeout: float = 10.0) -> int:
    """Send records (and a sibling topic's) until ``done()``; slow joiners miss the first."""
    deadline = time.monotonic() + timeout
    seq = 0
    while not done():
        assert time.monotonic() < deadline, "consumer did not finish"
        sock.send_multipart(record_frames(seq, tokens=2))
        sock.send_multipart(record_frames(seq, topic=TOPIC + "b", publisher=99))
        seq += 1
        time.sleep(0.01)
    return seq


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
