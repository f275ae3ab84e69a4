"""Run one shadow-consumer per pod behind a headless Service, following scale events.

A ZeroMQ SUB socket connected to a DNS name reaches one address, resolved at
connect time. This launcher re-resolves the headless Service every
RESOLVE_INTERVAL_S seconds, starts one ``shadow-consumer --endpoint
tcp://IP:TAP_PORT --topic TOPIC`` per address, restarts a child that exits
while its address is still listed, and stops a child RETIRE_AFTER_S seconds
after its address left DNS (a draining pod still flushes its tail). SIGTERM
stops every child (each writes its summary) and then the launcher.

Environment: TAPS_SERVICE, TAP_PORT, TOPIC (required); SUMMARY_DIR,
RESOLVE_INTERVAL_S [15], RETIRE_AFTER_S [90], CONSUMER [shadow-consumer],
CONSUMER_ARGS (more arguments for each child, shell-quoted, e.g. "--interval 60").
Standard library only: it runs with the image's Python.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

log = logging.getLogger("consumer-launcher")


def resolve(host: str, port: int) -> set[str]:
    """The addresses ``host`` resolves to now (empty when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        log.warning("cannot resolve %s: %s", host, e)
        return set()
    return {str(info[4][0]) for info in infos}


def endpoint(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def command(
    consumer: str, ip: str, port: int, topic: str, summary_dir: str | None, extra: str = ""
) -> list[str]:
    cmd = [consumer, "--endpoint", endpoint(ip, port), "--topic", topic]
    if summary_dir:
        safe = ip.replace(":", "_")
        cmd += ["--summary-path", os.path.join(summary_dir, f"{topic}-{safe}.json")]
    return cmd + shlex.split(extra)


def plan(
    running: set[str],
    exited: set[str],
    listed: set[str],
    gone_since: dict[str, float],
    now: float,
    retire_after: float,
) -> tuple[set[str], set[str]]:
    """Which addresses to start and which to stop; updates ``gone_since``.

    Start: listed and not running, or running but exited (restart). Stop: not
    listed for ``retire_after`` seconds or more.
    """
    for ip in listed:
        gone_since.pop(ip, None)
    stop = set()
    for ip in running - listed:
        since = gone_since.setdefault(ip, now)
        if now - since >= retire_after:
            stop.add(ip)
    for ip in stop:
        gone_since.pop(ip, None)
    start = (listed - running) | (exited & listed)
    return start, stop


def terminate(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host = os.environ["TAPS_SERVICE"]
    port = int(os.environ["TAP_PORT"])
    topic = os.environ["TOPIC"]
    summary_dir = os.environ.get("SUMMARY_DIR")
    interval = float(os.environ.get("RESOLVE_INTERVAL_S", "15"))
    retire_after = float(os.environ.get("RETIRE_AFTER_S", "90"))
    consumer = os.environ.get("CONSUMER", "shadow-consumer")
    extra = os.environ.get("CONSUMER_ARGS", "")

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    children: dict[str, subprocess.Popen] = {}
    gone_since: dict[str, float] = {}
    while not stopping.is_set():
        listed = resolve(host, port)
        exited = {ip for ip, proc in children.items() if proc.poll() is not None}
        for ip in exited:
            log.warning("consumer for %s exited with %s", ip, children[ip].returncode)
        start, stop = plan(
            set(children), exited, listed, gone_since, time.monotonic(), retire_after
        )
        for ip in stop:
            log.info("retiring consumer for %s (gone from %s)", ip, host)
            terminate(children.pop(ip))
        for ip in exited - listed:
            children.pop(ip, None)
            gone_since.pop(ip, None)
        for ip in sorted(start):
            log.info("starting consumer for %s", endpoint(ip, port))
            children[ip] = subprocess.Popen(command(consumer, ip, port, topic, summary_dir, extra))
        stopping.wait(interval)
    for proc in children.values():
        proc.send_signal(signal.SIGTERM)
    for proc in children.values():
        terminate(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
