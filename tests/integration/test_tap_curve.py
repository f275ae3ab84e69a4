"""Taps that authenticate (issue 18 item 9): ZeroMQ CURVE per tap, consumers
with a key pair and the tap's public key; a wrong key reads nothing, the right
one reads; taps bind loopback unless told, and say so when they do not."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
import zmq.auth

from shadow_proxy.devtools.processes import reserve_port
from shadow_proxy.records import sources, wire
from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    raw_exchange,
)

pytestmark = pytest.mark.timeout(120)

TOPIC = "shadow-requests-a"
CHAT = json.dumps({"model": "deepseek", "messages": [{"role": "user", "content": "hi"}]}).encode()


def keys(tmp_path: Path) -> Path:
    """server, allowed client and stranger key pairs; ``allowed/`` holds the one public key."""
    root = tmp_path / "keys"
    root.mkdir()
    for name in ("server", "client", "stranger"):
        zmq.auth.create_certificates(root, name)
    (root / "allowed").mkdir()
    (root / "allowed" / "client.key").write_bytes((root / "client.key").read_bytes())
    return root


def curve_text(model_dir: Path, tap_port: int, key_dir: str = "keys") -> str:
    return (
        f"models:\n  - {{name: deepseek, tokenizer: '{model_dir}'}}\n"
        "taps:\n  - name: a\n    capture: request\n"
        f"    endpoint: 'tcp://127.0.0.1:{tap_port}'\n"
        f"    curve: {{server_secret_key: {key_dir}/server.key_secret, "
        f"client_keys: {key_dir}/allowed}}\n"
    )


def sub(context: zmq.Context, endpoint: str, server: Path | None, client: Path | None):
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    if server is not None and client is not None:
        socket.curve_serverkey = zmq.auth.load_certificate(server)[0]
        socket.curve_publickey, socket.curve_secretkey = zmq.auth.load_certificate(client)
    socket.subscribe(TOPIC.encode())
    socket.connect(endpoint)
    return socket


def received(socket: zmq.Socket) -> list[wire.Message]:
    out = []
    while True:
        try:
            out.append(wire.decode_frames(socket.recv_multipart(flags=zmq.NOBLOCK)))
        except zmq.Again:
            return out


async def test_wrong_keys_are_refused_and_the_right_one_reads(tmp_path, model_dirs):
    key_root = keys(tmp_path)
    tap_port = reserve_port()
    endpoint = f"tcp://127.0.0.1:{tap_port}"
    async with RawFrontend() as frontend:
        # Key paths relative to the configuration file's directory.
        text = config_text(reserve_port(), frontend.url) + curve_text(
            model_dirs["deepseek"], tap_port
        )
        proxy = Proxy(tmp_path, text).start()
        context = zmq.Context()
        strangers = [
            sub(context, endpoint, None, None),  # no CURVE at all
            sub(context, endpoint, key_root / "server.key", key_root / "stranger.key_secret"),
            # The allowed client, but believing another server key.
            sub(context, endpoint, key_root / "stranger.key", key_root / "client.key_secret"),
        ]
        args = argparse.Namespace(
            sources=[],
            endpoint=[endpoint],
            topic=TOPIC,
            discover=None,
            tap=None,
            nats=None,
            stream="SHADOW",
            durable=None,
            curve_server_key=str(key_root / "server.key"),
            curve_client_key=str(key_root / "client.key_secret"),
        )
        source = sources.open_source(args, heartbeats=True)
        try:
            await proxy.wait_ready()
            deliveries = source.__aiter__()
            async with asyncio.timeout(20):  # a heartbeat: the right key is connected
                while (await anext(deliveries)).heartbeat is None:
                    pass
            answer = await raw_exchange(
                proxy.port,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n" % len(CHAT) + CHAT,
            )
            assert answer.startswith(b"HTTP/1.1 200")
            async with asyncio.timeout(20):
                while (delivery := await anext(deliveries)).heartbeat is not None:
                    pass
            assert delivery.envelope["tap"] == "a"
            assert delivery.envelope["request"]["token_ids"]
            # Three more heartbeats reach the right key; the strangers still have nothing.
            beats = 0
            async with asyncio.timeout(20):
                while beats < 3:
                    beats += (await anext(deliveries)).heartbeat is not None
            for socket in strangers:
                assert received(socket) == []
        finally:
            for socket in strangers:
                socket.close()
            context.term()
            await source.aclose()
            assert proxy.stop() == 0


def test_a_missing_key_file_fails_start_up_naming_the_line(tmp_path, model_dirs):
    config = tmp_path / "proxy.yaml"
    config.write_text(
        config_text(reserve_port(), "http://127.0.0.1:9")
        + curve_text(model_dirs["deepseek"], reserve_port(), key_dir="missing")
    )
    result = subprocess.run(
        [sys.executable, "-m", "shadow_proxy.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"shadow-proxy: {config}:11: 'taps[a].curve': tap 'a' CURVE keys"), line
    assert str(tmp_path / "missing" / "server.key_secret") in line


class TestBindings:
    """Loopback by default; all interfaces without CURVE is said in the log."""

    async def start_and_log(self, tmp_path: Path, publish: str, curve: str = "") -> bytes:
        text = (
            config_text(reserve_port(), "http://127.0.0.1:9")
            + f"publish: {{{publish}base_port: {reserve_port()}}}\n"
            + "taps:\n  - name: a\n    capture: request\n"
            + curve
        )
        proxy = Proxy(tmp_path, text).start()
        try:
            await proxy.wait_ready()
            listing = json.loads(
                (
                    await raw_exchange(
                        proxy.port,
                        b"GET /shadow/taps HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n",
                    )
                ).partition(b"\r\n\r\n")[2]
            )
        finally:
            assert proxy.stop() == 0
        return listing["taps"][0]["endpoint"].encode() + b"\n" + proxy.log()

    async def test_default_is_loopback_and_quiet(self, tmp_path):
        out = await self.start_and_log(tmp_path, "")
        assert out.startswith(b"tcp://127.0.0.1:")
        assert b"without CURVE" not in out

    async def test_all_interfaces_without_curve_warns(self, tmp_path):
        out = await self.start_and_log(tmp_path, "host: 0.0.0.0, ")
        assert out.startswith(b"tcp://0.0.0.0:")
        assert b"tap a binds every interface (tcp://0.0.0.0:" in out
        assert b"without CURVE" in out

    async def test_all_interfaces_with_curve_is_quiet(self, tmp_path):
        keys(tmp_path)
        curve = (
            "    curve: {server_secret_key: keys/server.key_secret, client_keys: keys/allowed}\n"
        )
        out = await self.start_and_log(tmp_path, "host: 0.0.0.0, ", curve)
        assert out.startswith(b"tcp://0.0.0.0:")
        assert b"without CURVE" not in out
