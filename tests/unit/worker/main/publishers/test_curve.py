"""CURVE for taps on real ZeroMQ sockets: a tap's keys loaded from the files
``zmq.auth.create_certificates`` writes, errors naming the configuration line,
and a CURVE server that the listed consumer reads and a stranger does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from shadow_proxy.config import Config, CurveKeys
from shadow_proxy.worker.main.publishers.curve import (
    CurveKeyError,
    load_all,
    load_tap_keys,
    make_server,
    start_authenticator,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """server, client and stranger key pairs; ``allowed/`` holds the client's public key."""
    for name in ("server", "client", "stranger"):
        zmq.auth.create_certificates(tmp_path, name)
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "client.key").write_bytes((tmp_path / "client.key").read_bytes())
    (tmp_path / "allowed" / "README").write_text("only *.key files count\n")
    return tmp_path


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def public(path: Path) -> bytes:
    return zmq.auth.load_certificate(path)[0]


class TestLoad:
    """The tap's key pair and its allowed consumers, from files."""

    def test_directory_of_allowed_keys(self, keys: Path) -> None:
        tap = load_tap_keys(CurveKeys(str(keys / "server.key_secret"), str(keys / "allowed")))
        assert tap.public == public(keys / "server.key") and len(tap.secret) == 40
        assert tap.allowed == {public(keys / "client.key")}

    def test_one_allowed_key_file(self, keys: Path) -> None:
        tap = load_tap_keys(CurveKeys(str(keys / "server.key_secret"), str(keys / "stranger.key")))
        assert tap.allowed == {public(keys / "stranger.key")}

    def test_a_public_key_file_is_no_key_pair(self, keys: Path) -> None:
        with pytest.raises(ValueError, match="holds no secret-key"):
            load_tap_keys(CurveKeys(str(keys / "server.key"), str(keys / "allowed")))

    def test_an_empty_directory_allows_nobody(self, keys: Path) -> None:
        (keys / "empty").mkdir()
        with pytest.raises(ValueError, match="holds no public key"):
            load_tap_keys(CurveKeys(str(keys / "server.key_secret"), str(keys / "empty")))

    def test_errors_name_the_line(self, keys: Path) -> None:
        path = keys / "proxy.yaml"
        path.write_text(
            "schema_version: 1\n"
            "upstream: {url: 'http://127.0.0.1:9'}\n"
            "taps:\n"
            "  - name: plain\n    capture: request\n"
            "  - name: a\n    capture: request\n"
            "    curve: {server_secret_key: missing.key_secret, client_keys: allowed}\n"
        )
        config = Config.from_yaml(path)
        with pytest.raises(CurveKeyError) as error:
            load_all(config)
        message = str(error.value)
        assert message.startswith(f"{path}:8: 'taps[a].curve': tap 'a' CURVE keys cannot be read")
        assert "missing.key_secret" in message

    def test_only_curve_taps(self, keys: Path) -> None:
        config = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:9"},
                "taps": [{"name": "plain", "capture": "request"}],
            }
        )
        assert load_all(config) == {}


class TestServer:
    """Only a consumer whose public key is allowed, and who knows the tap's key, reads."""

    def subscriber(self, context: zmq.Context, endpoint: str, server: Path, client: Path):
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.curve_serverkey = public(server)
        sub.curve_publickey, sub.curve_secretkey = zmq.auth.load_certificate(client)
        sub.subscribe(b"")
        sub.connect(endpoint)
        return sub

    def test_allowed_reads_stranger_does_not(self, keys: Path, context: zmq.Context) -> None:
        tap = load_tap_keys(CurveKeys(str(keys / "server.key_secret"), str(keys / "allowed")))
        authenticator = start_authenticator(context, {"a": tap})
        assert authenticator is not None
        pub = context.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        subs: list[zmq.Socket] = []
        try:
            make_server(pub, "a", tap)
            pub.bind("tcp://127.0.0.1:*")
            endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            stranger = self.subscriber(
                context, endpoint, keys / "server.key", keys / "stranger.key_secret"
            )
            client = self.subscriber(
                context, endpoint, keys / "server.key", keys / "client.key_secret"
            )
            subs += [stranger, client]
            # The XPUB sees a subscription only from a consumer that passed the handshake.
            assert pub.poll(10_000), "the allowed consumer never subscribed"
            assert pub.recv() == b"\x01"
            pub.send(b"record")
            assert client.poll(5_000) and client.recv() == b"record"
            assert not pub.poll(500), "a stranger's subscription got through"
            assert not stranger.poll(200)
        finally:
            for sub in subs:
                sub.close(linger=0)
            pub.close(linger=0)
            authenticator.stop()

    def test_no_curve_tap_no_authenticator(self, context: zmq.Context) -> None:
        assert start_authenticator(context, {}) is None
