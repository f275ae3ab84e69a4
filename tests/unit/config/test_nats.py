"""The ``nats`` section and the per-tap ``transport``/``subject`` keys (SPEC sections 2 and 9):
defaults, and every rejection with file, line, key, expectation and value."""

from __future__ import annotations

import textwrap

import pytest

from shadow_proxy.config import GIB, NatsConfig
from tests.support import config_files
from tests.support.config_files import BASE, assert_names, load, rejected

NATS = """\
nats:
  servers: [nats://127.0.0.1:4222]
"""


def with_taps(body: str, nats: str = NATS) -> str:
    """A configuration with the ``nats`` section and the taps of ``body``."""
    return config_files.with_taps(body, nats)


class TestDefaults:
    """Without the keys, taps stay on ZeroMQ; the section's defaults are SPEC 9's."""

    def test_zmq_by_default_and_no_section(self, tmp_path):
        config = load(tmp_path, BASE + "taps:\n  - {name: a, capture: request}\n")
        assert config.nats is None
        assert (config.taps[0].transport, config.taps[0].subject) == ("zmq", None)

    def test_section_defaults(self, tmp_path):
        config = load(tmp_path, with_taps("- {name: a, capture: request, transport: nats}\n"))
        assert config.nats == NatsConfig(
            servers=("nats://127.0.0.1:4222",),
            stream="SHADOW",
            replicas=1,
            max_bytes=8 * GIB,
            max_age_s=7 * 86400.0,
            discard="old",
        )
        assert config.taps[0].subject == "shadow.shadow-requests-a"

    def test_subject_follows_the_topic(self, tmp_path):
        config = load(
            tmp_path, with_taps("- {name: a, topic: replay, capture: request, transport: nats}\n")
        )
        assert config.taps[0].subject == "shadow.replay"

    def test_topic_prefix_rule_is_for_zeromq_taps_only(self, tmp_path):
        body = """\
            - {name: a, topic: kv, capture: request}
            - {name: b, topic: kv-js, capture: request, transport: nats}
            """
        config = load(tmp_path, with_taps(body))
        assert [t.topic for t in config.taps] == ["kv", "kv-js"]
        body = body.replace(", transport: nats", "")
        message = rejected(tmp_path, with_taps(body))
        assert_names(message, tmp_path, 7, "taps[a].topic", "prefix", "'kv'")

    def test_everything_given(self, tmp_path):
        nats = """\
            nats:
              servers: [nats://a:4222, tls://b:4222]
              stream: FLEET_1
              replicas: 3
              max_bytes: 1024
              max_age_s: 60
              discard: new
            """
        config = load(
            tmp_path,
            with_taps(
                "- {name: a, capture: request, transport: nats, subject: fleet.a.records}\n",
                textwrap.dedent(nats),
            ),
        )
        assert config.nats == NatsConfig(
            ("nats://a:4222", "tls://b:4222"), "FLEET_1", 3, 1024, 60.0, "new"
        )
        assert config.taps[0].subject == "fleet.a.records"


class TestRejections:
    """Every invalid value stops start-up and says where and why."""

    def test_section_required_by_a_nats_tap(self, tmp_path):
        message = rejected(
            tmp_path, BASE + "taps:\n  - {name: a, capture: request, transport: nats}\n"
        )
        assert_names(message, tmp_path, 1, "nats", "required", "tap 'a'")

    def test_unknown_transport(self, tmp_path):
        message = rejected(tmp_path, with_taps("- {name: a, capture: request, transport: kafka}\n"))
        assert_names(message, tmp_path, 7, "taps[a].transport", "zmq, nats", "'kafka'")

    def test_subject_on_a_zmq_tap(self, tmp_path):
        message = rejected(tmp_path, with_taps("- {name: a, capture: request, subject: x.y}\n"))
        assert_names(message, tmp_path, 7, "taps[a].subject", "transport: nats", "'x.y'")

    def test_endpoint_on_a_nats_tap(self, tmp_path):
        body = "- {name: a, capture: request, transport: nats, endpoint: 'tcp://127.0.0.1:1'}\n"
        message = rejected(tmp_path, with_taps(body))
        assert_names(message, tmp_path, 7, "taps[a].endpoint", "transport: zmq")

    @pytest.mark.parametrize("subject", ["shadow.*", "shadow.>", "a..b", "has space", ".a", "a."])
    def test_bad_subject(self, tmp_path, subject):
        body = f"- {{name: a, capture: request, transport: nats, subject: '{subject}'}}\n"
        message = rejected(tmp_path, with_taps(body))
        assert_names(message, tmp_path, 7, "taps[a].subject", "NATS subject", repr(subject))

    def test_duplicate_subject(self, tmp_path):
        body = """\
            - {name: a, capture: request, transport: nats, subject: s.x}
            - {name: b, capture: request, transport: nats, subject: s.x}
            """
        message = rejected(tmp_path, with_taps(body))
        assert_names(message, tmp_path, 8, "taps[b].subject", "unique", "'s.x'")

    def test_subject_is_another_taps_heartbeat(self, tmp_path):
        body = """\
            - {name: a, capture: request, transport: nats, subject: s.x}
            - {name: b, capture: request, transport: nats, subject: s.x.heartbeat}
            """
        message = rejected(tmp_path, with_taps(body))
        assert_names(message, tmp_path, 8, "taps[b].subject", "heartbeat", "tap 'a'")

    @pytest.mark.parametrize(
        ("key", "value", "line", "expected"),
        [
            ("servers", "[]", 5, "a list of at least one"),
            ("servers", "nats://x:1", 5, "a list of at least one"),
            ("servers", "[http://x:1]", 5, "NATS server URL"),
            ("stream", "'a.b'", 6, "[A-Za-z0-9_-]+"),
            ("replicas", "0", 6, "between 1 and 5"),
            ("replicas", "7", 6, "between 1 and 5"),
            ("max_bytes", "0", 6, "at least 1"),
            ("max_age_s", "0", 6, "positive"),
            ("discard", "oldest", 6, "old, new"),
            ("replica", "3", 6, "not a known key"),
        ],
    )
    def test_bad_section_value(self, tmp_path, key, value, line, expected):
        servers = "" if key == "servers" else "  servers: [nats://127.0.0.1:4222]\n"
        message = rejected(tmp_path, BASE + f"nats:\n{servers}  {key}: {value}\n")
        assert_names(message, tmp_path, line, f"nats.{key}")
        assert expected in message, message


class TestAuthAndTls:
    """``nats.auth`` and ``nats.tls`` (issue 31): secrets named, never given;
    paths relative to the file; one credential kind."""

    def test_read_and_resolved(self, tmp_path):
        text = BASE + textwrap.dedent("""\
            nats:
              servers: [tls://127.0.0.1:4222]
              auth: {user: proxy, password_file: secrets/password}
              tls: {ca_file: secrets/ca.pem, cert_file: c.pem, key_file: c.key}
            """)
        config = load(tmp_path, text)
        access = config.nats.access()
        assert access.user == "proxy"
        assert access.password_file == tmp_path / "secrets" / "password"
        assert access.ca_file == tmp_path / "secrets" / "ca.pem" and access.tls
        assert "password from" in access.describe()

    def test_environment_variable(self, tmp_path):
        text = BASE + "nats:\n  servers: [nats://x:1]\n  auth: {token_env: NATS_TOKEN}\n"
        assert load(tmp_path, text).nats.access().token_env == "NATS_TOKEN"

    @pytest.mark.parametrize(
        ("section", "key", "expected"),
        [
            ("auth: {user: u, token_env: T}", "nats.auth", "one credential kind"),
            ("auth: {user: u}", "nats.auth", "a user needs a password"),
            ("auth: {token_env: 'not a name'}", "nats.auth.token_env", "variable name"),
            ("auth: {password: hunter2}", "nats.auth.password", "not a known key"),
            ("tls: {cert_file: c.pem}", "nats.tls", "needs its key"),
        ],
    )
    def test_rejected(self, tmp_path, section, key, expected):
        message = rejected(tmp_path, BASE + f"nats:\n  servers: [nats://x:1]\n  {section}\n")
        assert_names(message, tmp_path, 6, key)
        assert expected in message, message
