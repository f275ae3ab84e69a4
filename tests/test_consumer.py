"""The consumer: gap accounting without sockets, then the runner on real sockets."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from shadow_proxy.consumer import main as consumer
from shadow_proxy.consumer.accounting import Accounts
from shadow_proxy.devtools.processes import Child
from shadow_proxy.records import envelope as records
from shadow_proxy.records import files, wire
from shadow_proxy.records.discovery import discover
from shadow_proxy.records.seqs import SeqTracker

ROOT = Path(__file__).resolve().parent.parent
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


def heartbeat_frames(
    next_seq: int, last_transport: int | None, *, publisher: int = 1, beat: int = 0
) -> list[bytes]:
    payload = wire.Heartbeat("a", publisher, next_seq, last_transport, dropped={"full": 1}).encode()
    return wire.encode_frames(wire.heartbeat_topic(TOPIC), publisher, beat, 0, payload)


def feed(accounts: Accounts, seqs, now: float = 0.0, **kwargs) -> None:
    for seq in seqs:
        accounts.on_frames(record_frames(seq, **kwargs), now)


class TestSeqTracker:
    """Missing values are counted over the seen range, in any arrival order."""

    def test_reordering_is_not_a_gap(self):
        tracker = SeqTracker()
        for value in (4, 6, 5, 7):
            tracker.observe(value)
        assert tracker.gaps() == 0
        tracker.observe(10)
        assert tracker.gaps() == 2
        tracker.observe(8)
        assert tracker.gaps() == 1
        assert (tracker.first, tracker.last, tracker.seen) == (4, 10, 6)

    def test_arrival_below_the_first_extends_the_range(self):
        tracker = SeqTracker()
        for value in (5, 3):
            tracker.observe(value)
        assert tracker.gaps() == 1

    def test_duplicates(self):
        tracker = SeqTracker()
        assert tracker.observe(1)
        assert not tracker.observe(1)
        assert tracker.duplicates == 1
        assert tracker.gaps() == 0

    def test_holes_are_bounded(self):
        tracker = SeqTracker(max_holes=3)
        for value in range(0, 20, 2):  # 9 holes
            tracker.observe(value)
        assert len(tracker._starts) <= 4
        assert tracker.gaps() == 9
        assert tracker.written_off > 0
        tracker.observe(17)  # a remembered hole fills
        assert tracker.gaps() == 8


class TestAccounts:
    """Per publisher totals: gaps, late joins, duplicates, restarts and tail loss."""

    def test_totals(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1], tokens=5)
        accounts.on_frames(
            record_frames(2, response={"outcome": "complete", "output_tokens": 7}), 0
        )
        accounts.on_frames(
            record_frames(3, response={"outcome": "cancelled", "output_tokens": 2}), 0
        )
        summary = accounts.summary(0)
        assert summary["records"] == 4
        assert summary["prompt_tokens"] == 5 + 5 + 3 + 3
        assert summary["output_tokens"] == 9
        assert summary["outcomes"] == {"cancelled": 1, "complete": 1}
        assert summary["tap_gaps"] == summary["transport_gaps"] == 0

    def test_out_of_order_arrival_is_not_a_gap(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 2, 1, 3])
        assert accounts.summary(0)["tap_gaps"] == 0

    def test_tap_drop_is_a_tap_gap_not_a_transport_gap(self):
        accounts = Accounts(TOPIC)
        for transport, seq in enumerate([0, 1, 3, 4]):  # seq 2 dropped in the tap
            accounts.on_frames(record_frames(seq, transport=transport), 0)
        summary = accounts.summary(0)
        assert (summary["tap_gaps"], summary["transport_gaps"]) == (1, 0)

    def test_transport_loss(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1, 4])
        summary = accounts.summary(0)
        assert (summary["tap_gaps"], summary["transport_gaps"]) == (2, 2)

    def test_late_join_is_not_a_gap(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [1000, 1001, 1002])
        summary = accounts.summary(0)
        assert summary["tap_gaps"] == 0
        assert summary["publishers"][0]["first_seq"] == 1000

    def test_duplicates_are_counted_once(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0, 1, 1, 2])
        summary = accounts.summary(0)
        assert summary["records"] == 3
        assert summary["prompt_tokens"] == 9
        assert summary["duplicates"] == 1

    def test_publisher_restart_starts_fresh(self):
        accounts = Accounts(TOPIC)
        feed(accounts, range(5), publisher=1)
        feed(accounts, range(3), publisher=2)  # a new process: seq from 0 again
        summary = accounts.summary(0)
        assert summary["records"] == 8
        assert summary["duplicates"] == summary["tap_gaps"] == 0
        by_id = {p["publisher_id"]: p for p in summary["publishers"]}
        assert (by_id[1]["records"], by_id[2]["records"]) == (5, 3)

    def test_tail_loss_after_grace(self):
        accounts = Accounts(TOPIC, grace=2.0)
        feed(accounts, range(5))  # transport 0..4
        accounts.on_frames(heartbeat_frames(next_seq=8, last_transport=6), now=10.0)
        assert accounts.summary(11.0)["tail_loss"] == 0  # may still be on the way
        summary = accounts.summary(12.0)
        assert summary["tail_loss"] == 3  # seq 5, 6, 7
        assert summary["transport_tail_loss"] == 2  # transport 5, 6
        assert summary["tap_gaps"] == 0
        assert summary["heartbeats"] == 1
        assert summary["publishers"][0]["last_heartbeat"]["dropped"] == {"full": 1}
        feed(accounts, [5], now=13.0)  # a straggler
        assert accounts.summary(13.0)["tail_loss"] == 2

    def test_heartbeat_before_any_record_starts_the_range(self):
        accounts = Accounts(TOPIC, grace=0.0)
        accounts.on_frames(heartbeat_frames(next_seq=10, last_transport=9), 0)
        assert accounts.summary(1)["tail_loss"] == 0
        accounts.on_frames(heartbeat_frames(next_seq=12, last_transport=11, beat=1), 1)
        assert accounts.summary(2)["tail_loss"] == 2  # nothing arrived at all
        feed(accounts, [12, 13], now=2)
        assert accounts.summary(2)["tap_gaps"] == 2  # 10 and 11 never came

    def test_heartbeats_do_not_take_transport_sequences(self):
        accounts = Accounts(TOPIC)
        feed(accounts, [0])
        accounts.on_frames(heartbeat_frames(next_seq=1, last_transport=0), 0)
        feed(accounts, [1])
        assert accounts.summary(10)["transport_gaps"] == 0


class TestUndecodable:
    """Bad messages are counted by reason; none is fatal."""

    @pytest.mark.parametrize(
        ("frames", "reason"),
        [
            ([TOPIC.encode()], "frames"),
            ([TOPIC.encode(), b"x", b"y", b"z"], "frames"),
            ([*record_frames(0)[:3], b"\x09\x00\x00\x00\x00"], "header"),
            (record_frames(0, topic=TOPIC + "b"), "topic"),  # a sibling topic, prefix match
            (record_frames(0, topic="shadow"), "topic"),
            (wire.encode_frames(TOPIC, 1, 0, 0, b"\x93\x01\x02\x03"), "envelope"),
            (record_frames(0, schema_version=2), "schema"),
            (record_frames(0, request={"model": "m"}), "record"),
            (record_frames(0, tap=5), "record"),
            (wire.encode_frames(wire.heartbeat_topic(TOPIC), 1, 0, 0, b"\x80"), "heartbeat"),
        ],
    )
    def test_counted(self, frames, reason):
        accounts = Accounts(TOPIC)
        assert accounts.on_frames(frames, 0) is None
        summary = accounts.summary(0)
        assert summary["undecodable"] == {reason: 1}
        assert summary["records"] == 0

    def test_missing_field(self):
        envelope = {"schema_version": 1, "seq": 0}
        frames = wire.encode_frames(TOPIC, 1, 0, 0, wire.encode_envelope(envelope))
        accounts = Accounts(TOPIC)
        accounts.on_frames(frames, 0)
        assert accounts.undecodable == {"record": 1}


class TestRecordFile:
    """Raw records are length-prefixed and rotate by size."""

    def test_rotation(self, tmp_path):
        path = tmp_path / "records.bin"
        recorder = files.RecordFile(path, max_bytes=150, keep=2)
        payloads = [bytes([i]) * 10 for i in range(7)]
        for i, payload in enumerate(payloads):  # 71 bytes an entry with the prefix
            recorder.write(wire.Message("t", 1, i, 0, payload))
        recorder.close()
        assert files.read_payloads(path) == payloads[6:]
        assert files.read_payloads(tmp_path / "records.bin.1") == payloads[4:6]
        assert files.read_payloads(tmp_path / "records.bin.2") == payloads[2:4]
        assert not (tmp_path / "records.bin.3").exists()


# --- real sockets ----------------------------------------------------------------------


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


class TestDiscovery:
    """--discover reads the proxy's tap list; a wildcard bind is reached at the proxy host."""

    def test_discover(self):
        listing = [
            {"name": "other", "topic": "t-other", "endpoint": "tcp://0.0.0.0:5558"},
            {"name": "a", "topic": TOPIC, "endpoint": "tcp://0.0.0.0:5557"},
        ]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_port}/shadow/taps"
            assert discover(url, "a") == (TOPIC, "tcp://127.0.0.1:5557")
            with pytest.raises(LookupError, match="'missing' not found"):
                discover(url, "missing")
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
