"""The consumer's runner on a real SUB socket, in this process."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import zmq

from shadow_proxy.consumer import main as consumer
from shadow_proxy.records import envelope as records
from shadow_proxy.records import files, wire

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


class TestRunner:
    """The runner on a real SUB socket, stopping by itself or on SIGTERM."""

    def test_max_records_summary_and_record_file(self, tmp_path):
        summary_path = tmp_path / "summary.json"
        record_path = tmp_path / "records.bin"
        with publisher() as (sock, endpoint):
            argv = [
                "--endpoint",
                endpoint,
                "--topic",
                TOPIC,
                "--max-records",
                "5",
                "--interval",
                "0.05",
                "--summary-path",
                str(summary_path),
                "--record",
                str(record_path),
                "--duration",
                "20",
            ]
            result: list[int] = []
            out = open(os.devnull, "w")  # noqa: SIM115
            thread = threading.Thread(
                target=lambda: result.append(consumer.run_consumer(argv, out=out, err=out))
            )
            thread.start()
            publish_until(sock, lambda: not thread.is_alive())
            thread.join(5)
            out.close()
        assert result == [0]
        summary = json.loads(summary_path.read_text())
        assert summary["records"] == 5
        assert summary["prompt_tokens"] == 10
        assert summary["tap_gaps"] == summary["transport_gaps"] == 0
        assert summary["endpoints"] == [endpoint]
        assert [p["records"] for p in summary["publishers"]] == [5]
        assert summary["undecodable"].get("topic", 0) >= 1  # the sibling topic, rejected
        raw = files.read_payloads(record_path)
        assert len(raw) == 5
        assert wire.decode_envelope(raw[0])["tap"] == "a"
        assert not list(tmp_path.glob(".*.tmp"))
