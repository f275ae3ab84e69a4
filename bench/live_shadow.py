"""The live shadow over a long run: the replayer's RSS and how fast /metrics answers.

``python -m bench.live_shadow --help``. Not part of the tests. What runs:

1. two built-in frontends (``shadow-proxy mock-frontend``, ``--ttft-ms`` and
   ``--itl-ms`` of latency), candidate and baseline, each a process;
2. a ZeroMQ PUB socket in this process publishing joined records (the
   frontend's own output as the primary's, as ``bench_replay`` writes them)
   at ``--rate`` records/s, each with a new seq and request id;
3. ``shadow-replay --endpoint ... --metrics-port`` as a child process, window
   ``--window-s``, for ``--duration-s``, then SIGTERM.

Measured: the replayer's RSS every ``--sample-s`` (``/proc/PID/statm``), its
judge process's apart (the replayer's children), and the wall time of a
``GET /metrics`` once a second. Reported: RSS once the first window is full
(``--window-s`` plus one minute of warm-up) and its highest and lowest after
that, the growth as a share of the first, the judge's RSS over the same span,
the /metrics p50, p90, p99 and max, the requests replayed, the judge crashes
and the exit status after SIGTERM. A line a minute on stderr says how far it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import zmq

from bench.bench_replay import MODEL, bench_envelope, frontend_ids, mock_frontend_argv
from bench.procfs import children, rss_mb
from bench.tables import commit
from shadow_proxy.devtools.processes import Child, reserve_port, wait_http_ok
from shadow_proxy.records import wire

TOPIC = "bench"
#: The /metrics line counting the requests the candidate answered.
CANDIDATE_OK = 'shadow_replay_requests_total{outcome="ok",target="candidate"}'


def publish(endpoint_out: list[str], stop: threading.Event, args: argparse.Namespace) -> None:
    """Joined records at ``args.rate`` a second until ``stop``."""
    ids = frontend_ids(args.max_tokens)
    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind("tcp://127.0.0.1:*")
    endpoint_out.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
    started, sent = time.monotonic(), 0
    try:
        while not stop.is_set():
            k, now_ns = sent % 1000, time.time_ns()
            envelope = bench_envelope(k, args.prompt_tokens, args.max_tokens, ids, now_ns)
            envelope["seq"], envelope["request_id"] = sent + 1, f"live-{sent}"
            payload = wire.encode_envelope(envelope)
            socket.send_multipart(wire.encode_frames(TOPIC, 9, sent + 1, 0, payload))
            sent += 1
            stop.wait(max(0.0, started + sent / args.rate - time.monotonic()))
    finally:
        socket.close(linger=0)
        context.term()


def scrape(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read().decode()
    return time.perf_counter() - started, body


def progress(
    sample: tuple[float, float, float], latencies: list[float], text: str, duration_s: float
) -> None:
    """One line a minute on stderr: where the run is (it lasts half an hour)."""
    elapsed, rss, judge = sample
    ok = sample_value(text, CANDIDATE_OK)
    print(
        f"live_shadow: {elapsed:.0f}/{duration_s:.0f} s, {ok:.0f} replayed, RSS {rss} MB"
        f" (judge {judge:.1f}), /metrics max so far {max(latencies) * 1e3:.1f} ms",
        file=sys.stderr,
        flush=True,
    )


def sample_value(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="live_shadow", description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--window-s", type=float, default=300.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench-live-"))
    urls, frontends = {}, []
    for name in ("candidate", "baseline"):
        port = reserve_port()
        urls[name] = f"http://127.0.0.1:{port}"
        frontend_argv = mock_frontend_argv(port, args.ttft_ms, args.itl_ms, args.max_tokens)
        frontends.append(Child(name, frontend_argv, scratch, merge_output=True).start())
    stop, endpoint = threading.Event(), []
    publisher = threading.Thread(target=publish, args=(endpoint, stop, args))
    #: (seconds, the replayer's RSS, its children's: the judge process)
    samples: list[tuple[float, float, float]] = []
    latencies: list[float] = []
    try:
        for name, frontend in zip(urls, frontends, strict=True):
            asyncio.run(wait_http_ok(urls[name] + "/health", 60, children=[frontend]))
        publisher.start()
        while not endpoint:
            time.sleep(0.05)
        metrics_port = reserve_port()
        replay_argv = [
            sys.executable,
            "-m",
            "shadow_proxy.replay.cli",
            "--endpoint",
            endpoint[0],
            "--topic",
            TOPIC,
            "--candidate",
            urls["candidate"],
            "--baseline",
            urls["baseline"],
            "--tokenizer",
            str(MODEL),
            "--metrics-port",
            str(metrics_port),
            "--window-s",
            str(args.window_s),
            "--out",
            str(scratch / "out"),
        ]
        log = (scratch / "replay.log").open("wb")
        replayer = subprocess.Popen(replay_argv, stdout=log, stderr=subprocess.STDOUT)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        asyncio.run(wait_http_ok(f"http://127.0.0.1:{metrics_port}/healthz", 60))
        started = time.monotonic()
        next_sample = started
        text = ""
        while time.monotonic() - started < args.duration_s:
            took, text = scrape(metrics_url)
            latencies.append(took)
            now = time.monotonic()
            if now >= next_sample:
                judge = sum(rss_mb(child) for child in children(replayer.pid))
                samples.append((round(now - started, 1), round(rss_mb(replayer.pid), 1), judge))
                next_sample += args.sample_s
                if len(samples) % max(1, round(60 / args.sample_s)) == 0:
                    progress(samples[-1], latencies, text, args.duration_s)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
        replayed = sample_value(text, CANDIDATE_OK)
        crashes = sample_value(text, "shadow_replay_judge_crashes_total")
        replayer.send_signal(signal.SIGTERM)
        status = replayer.wait(60)
        log.close()
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join(5)
        for frontend in frontends:
            frontend.terminate(10)
    full = [s for s in samples if s[0] >= args.window_s + 60] or samples[-1:]
    warm, judge_warm = [s[1] for s in full], [round(s[2], 1) for s in full]
    ordered = sorted(latencies)
    result: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "json" and v is not None},
        "machine": {"commit": commit()},
        "rss_mb_first_full_window": warm[0],
        "rss_mb_after": {"min": min(warm), "max": max(warm)},
        "rss_growth": round((max(warm) - warm[0]) / warm[0], 4),
        "judge_rss_mb_after": {"min": min(judge_warm), "max": max(judge_warm)},
        "metrics_ms": {
            "n": len(ordered),
            "p50": round(statistics.median(ordered) * 1e3, 2),
            "p90": round(ordered[int(0.90 * (len(ordered) - 1))] * 1e3, 2),
            "p99": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 2),
            "max": round(ordered[-1] * 1e3, 2),
        },
        "candidate_ok": replayed,
        "judge_crashes": crashes,
        "exit_status": status,
        "rss_samples": [[t, main, round(judge, 1)] for t, main, judge in samples],
    }
    text_out = json.dumps(result, indent=2)
    print(text_out)
    if args.json:
        args.json.write_text(text_out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
