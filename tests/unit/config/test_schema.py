"""The configuration file's schema (SPEC section 2): strict validation and defaults."""

from __future__ import annotations

import pytest

from shadow_proxy.config import MIB, Config, ConfigError
from tests.support.config_files import BASE, assert_names, rejected
from tests.support.config_files import with_taps as taps


class TestTapRejections:
    """Every invalid tap stops start-up with file, line, tap, key, expectation and value."""

    def test_duplicate_name(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("""\
                - name: a
                  capture: request
                - name: a
                  capture: request
                """),
        )
        assert_names(message, tmp_path, 7, "taps[a].name", "unique", "'a'")

    def test_duplicate_topic(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("""\
                - name: a
                  capture: request
                  topic: t1
                - name: b
                  capture: request
                  topic: t1
                """),
        )
        assert "'taps[a].topic'" in message or "'taps[b].topic'" in message, message
        assert "unique" in message
        assert "'t1'" in message
        path = tmp_path / "proxy.yaml"
        assert message.startswith((f"{path}:7: ", f"{path}:10: ")), message

    def test_topic_prefix_of_another(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("""\
                - name: a
                  capture: request
                  topic: kv
                - name: b
                  capture: request
                  topic: kv2
                """),
        )
        assert_names(message, tmp_path, 7, "taps[a].topic", "prefix", "'kv'", "kv2")

    def test_default_topics_one_prefix_of_another(self, tmp_path):
        """Names 'a' and 'a2' give default topics where one is a prefix of the other."""
        message = rejected(
            tmp_path,
            taps("""\
                - name: a
                  capture: request
                - name: a2
                  capture: request
                """),
        )
        assert "prefix" in message
        assert "shadow-requests-a" in message

    @pytest.mark.parametrize(
        ("key", "value"), [("name", "'a b'"), ("name", "'a.b'"), ("topic", "'x.y'")]
    )
    def test_bad_characters(self, tmp_path, key, value):
        body = "- name: a\n  capture: request\n"
        line = 6
        if key == "name":
            body = f"- name: {value}\n  capture: request\n"
            line = 5
        else:
            body += f"  topic: {value}\n"
            line = 7
        message = rejected(tmp_path, taps(body))
        tap = value.strip("'") if key == "name" else "a"
        assert_names(message, tmp_path, line, f"taps[{tap}].{key}", "[A-Za-z0-9_-]+", value)

    def test_capacity_zero(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  capacity: 0\n"))
        assert_names(message, tmp_path, 7, "taps[a].capacity", "at least 1", "(got 0)")

    def test_response_max_tokens_zero(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("- name: r\n  capture: request_response\n  response:\n    max_tokens: 0\n"),
        )
        assert_names(message, tmp_path, 8, "taps[r].response.max_tokens", "at least 1", "(got 0)")

    def test_emit_on_request_tap(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  emit: joined\n"))
        assert_names(message, tmp_path, 7, "taps[a].emit", "request_response", "'joined'")

    def test_response_on_request_tap(self, tmp_path):
        message = rejected(
            tmp_path, taps("- name: a\n  capture: request\n  response:\n    text: true\n")
        )
        assert_names(message, tmp_path, 7, "taps[a].response", "request_response", "text")

    def test_emit_other_than_joined(self, tmp_path):
        message = rejected(
            tmp_path, taps("- name: r\n  capture: request_response\n  emit: split\n")
        )
        assert_names(message, tmp_path, 7, "taps[r].emit", "joined", "'split'")

    def test_unknown_capture(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: everything\n"))
        assert_names(message, tmp_path, 6, "taps[a].capture", "request_response", "everything")

    def test_unknown_filter(self, tmp_path):
        message = rejected(
            tmp_path, taps("- name: a\n  capture: request\n  filters: [strip-everything]\n")
        )
        assert_names(message, tmp_path, 7, "taps[a].filters", "unknown filter", "strip-everything")

    @pytest.mark.parametrize("bad", ["max-tokens=0", "max-tokens=x", "max-tokens="])
    def test_bad_max_tokens_filter(self, tmp_path, bad):
        message = rejected(tmp_path, taps(f"- name: a\n  capture: request\n  filters: ['{bad}']\n"))
        assert_names(message, tmp_path, 7, "taps[a].filters", "positive integer", bad)

    def test_keep_worker_pins_with_tokens_only(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("- name: a\n  capture: request\n  filters: [keep-worker-pins, tokens-only]\n"),
        )
        assert_names(
            message, tmp_path, 7, "taps[a].filters", "conflicts", "keep-worker-pins", "tokens-only"
        )

    @pytest.mark.parametrize("sample", ["1.5", "-0.1", ".nan", ".inf"])
    def test_sample_outside_unit_interval(self, tmp_path, sample):
        message = rejected(tmp_path, taps(f"- name: a\n  capture: request\n  sample: {sample}\n"))
        assert_names(message, tmp_path, 7, "taps[a].sample", "between 0 and 1", "(got ")

    def test_sample_not_a_number(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  sample: true\n"))
        assert_names(message, tmp_path, 7, "taps[a].sample", "number", "True")

    def test_bad_sample_by(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  sample_by: user\n"))
        assert_names(message, tmp_path, 7, "taps[a].sample_by", "prefix", "'user'")

    def test_duplicate_endpoint(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("""\
                - name: a
                  capture: request
                  endpoint: tcp://127.0.0.1:6000
                - name: b
                  capture: request
                  endpoint: tcp://127.0.0.1:6000
                """),
        )
        assert_names(message, tmp_path, 10, "taps[b].endpoint", "tap 'a'", "tcp://127.0.0.1:6000")

    def test_endpoint_of_explicit_and_default_collide(self, tmp_path):
        """Tap 1's default endpoint is base_port + 1; another tap naming it is refused."""
        message = rejected(
            tmp_path,
            BASE
            + "publish: {host: 127.0.0.1, base_port: 7000}\n"
            + "taps:\n"
            + "  - name: a\n    capture: request\n    endpoint: tcp://127.0.0.1:7001\n"
            + "  - name: b\n    capture: request\n",
        )
        assert "endpoint" in message
        assert "tcp://127.0.0.1:7001" in message

    def test_bad_endpoint(self, tmp_path):
        message = rejected(
            tmp_path, taps("- name: a\n  capture: request\n  endpoint: 'http://x:1'\n")
        )
        assert_names(message, tmp_path, 7, "taps[a].endpoint", "ZeroMQ endpoint", "http://x:1")

    def test_unknown_tap_key(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  sampel: 0.5\n"))
        assert_names(message, tmp_path, 7, "taps[a].sampel", "not a known key", "sample")

    def test_unknown_response_key(self, tmp_path):
        message = rejected(
            tmp_path,
            taps("- name: r\n  capture: request_response\n  response:\n    txt: true\n"),
        )
        assert_names(message, tmp_path, 8, "taps[r].response.txt", "not a known key")

    def test_tap_models_not_names(self, tmp_path):
        message = rejected(tmp_path, taps("- name: a\n  capture: request\n  models: [1]\n"))
        assert_names(message, tmp_path, 7, "taps[a].models", "model names", "[1]")

    def test_taps_not_a_list(self, tmp_path):
        message = rejected(tmp_path, BASE + "taps: {name: a}\n")
        assert_names(message, tmp_path, 4, "taps", "list", "'name'")


class TestTopLevelRejections:
    """Unknown keys, schema_version, upstream and models are checked as strictly."""

    def test_unknown_top_level_key(self, tmp_path):
        message = rejected(tmp_path, BASE + "tapz: []\n")
        assert_names(message, tmp_path, 4, "tapz", "not a known key", "taps")

    @pytest.mark.parametrize(
        ("section", "key"),
        [("upstream", "timeout"), ("listen", "address"), ("publish", "port")],
    )
    def test_unknown_nested_key(self, tmp_path, section, key):
        text = BASE if section == "upstream" else BASE + f"{section}:\n"
        message = rejected(tmp_path, text + f"  {key}: 3\n")
        line = 4 if section == "upstream" else 5
        assert_names(message, tmp_path, line, f"{section}.{key}", "not a known key")

    def test_schema_version_missing(self, tmp_path):
        message = rejected(tmp_path, "upstream:\n  url: http://127.0.0.1:9\n")
        assert_names(message, tmp_path, 1, "schema_version", "required", "1")

    @pytest.mark.parametrize("version", ["2", "'1'", "true"])
    def test_schema_version_not_1(self, tmp_path, version):
        message = rejected(tmp_path, f"schema_version: {version}\nupstream:\n  url: http://x:9\n")
        assert_names(message, tmp_path, 1, "schema_version", "must be 1", "(got ")

    @pytest.mark.parametrize(
        "url", ["ftp://frontend:8000", "frontend:8000", "http://", "'http:///v1'"]
    )
    def test_bad_upstream_url(self, tmp_path, url):
        message = rejected(tmp_path, f"schema_version: 1\nupstream:\n  url: {url}\n")
        assert_names(message, tmp_path, 3, "upstream.url", "http://", url.strip("'"))

    def test_upstream_missing(self, tmp_path):
        message = rejected(tmp_path, "schema_version: 1\n")
        assert_names(message, tmp_path, 1, "upstream", "required")

    def test_upstream_url_missing(self, tmp_path):
        message = rejected(tmp_path, "schema_version: 1\nupstream:\n  connect_timeout_s: 3\n")
        assert_names(message, tmp_path, 3, "upstream.url", "required")

    @pytest.mark.parametrize(
        ("key", "value", "expected"),
        [
            ("connect_timeout_s", "0", "positive"),
            ("read_timeout_s", "-1", "positive"),
            ("max_connections", "0", "at least 1"),
            ("max_request_bytes", "'64MiB'", "integer"),
            ("quick_ack", "'yes'", "true or false"),
        ],
    )
    def test_bad_upstream_numbers(self, tmp_path, key, value, expected):
        message = rejected(tmp_path, BASE + f"  {key}: {value}\n")
        assert_names(message, tmp_path, 4, f"upstream.{key}", expected, "(got ")

    def test_bad_listen_port(self, tmp_path):
        message = rejected(tmp_path, BASE + "listen:\n  port: 70000\n")
        assert_names(message, tmp_path, 5, "listen.port", "port number", "70000")

    def test_model_duplicate_name(self, tmp_path):
        message = rejected(
            tmp_path,
            BASE + "models:\n  - name: m\n    tokenizer: /x\n  - name: m\n    tokenizer: /y\n",
        )
        assert_names(message, tmp_path, 7, "models[1].name", "unique", "'m'")

    def test_model_without_tokenizer(self, tmp_path):
        message = rejected(tmp_path, BASE + "models:\n  - name: m\n")
        assert_names(message, tmp_path, 5, "models[0].tokenizer", "required")

    def test_model_bad_context_length(self, tmp_path):
        message = rejected(
            tmp_path, BASE + "models:\n  - name: m\n    tokenizer: /x\n    context_length: 0\n"
        )
        assert_names(message, tmp_path, 7, "models[0].context_length", "at least 1", "(got 0)")

    def test_model_unknown_key(self, tmp_path):
        message = rejected(
            tmp_path, BASE + "models:\n  - name: m\n    tokenizer: /x\n    path: /z\n"
        )
        assert_names(message, tmp_path, 7, "models[0].path", "not a known key", "tokenizer")

    def test_model_not_a_mapping(self, tmp_path):
        message = rejected(tmp_path, BASE + "models:\n  - deepseek\n")
        assert_names(message, tmp_path, 1, "models[0]", "mapping", "'deepseek'")

    def test_not_yaml(self, tmp_path):
        message = rejected(tmp_path, BASE + "taps: [\n")
        assert message.startswith(f"{tmp_path / 'proxy.yaml'}:"), message
        assert "YAML" in message

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="cannot read"):
            Config.from_yaml(tmp_path / "absent.yaml")


class TestDefaults:
    """What an operator gets without saying it (SPEC section 2)."""

    def test_minimal_file(self, tmp_path):
        path = tmp_path / "proxy.yaml"
        path.write_text(BASE)
        config = Config.from_yaml(path)
        assert config.path == str(path)
        assert (config.listen.host, config.listen.port) == ("0.0.0.0", 8080)
        upstream = config.upstream
        assert upstream.url == "http://127.0.0.1:9"
        assert upstream.connect_timeout_s == 5
        assert upstream.read_timeout_s is None
        assert upstream.max_connections == 1024
        assert upstream.max_request_bytes == 64 * MIB == 64 * 1024 * 1024
        assert upstream.quick_ack is True
        assert config.request_id_header == "x-request-id"
        assert config.models == ()
        assert config.taps == ()
        # Taps bind loopback unless configured (issue 18): records hold the prompts.
        assert (config.publish.host, config.publish.base_port) == ("127.0.0.1", 5557)
        assert (config.listen.body_timeout_s, config.listen.max_connections) == (60.0, 8192)
        assert not config.capture_response

    def test_tap_defaults(self):
        config = Config.from_text(
            BASE
            + "taps:\n"
            + "  - {name: kv, capture: request}\n"
            + "  - {name: replay, capture: request_response}\n"
            + "  - {name: third, capture: request, endpoint: 'ipc:///tmp/t'}\n"
            + "  - {name: fourth, capture: request}\n"
        )
        kv, replay, third, fourth = config.taps
        assert kv.topic == "shadow-requests-kv"
        assert replay.topic == "shadow-requests-replay"
        assert kv.endpoint == "tcp://127.0.0.1:5557"
        assert replay.endpoint == "tcp://127.0.0.1:5558"
        assert third.endpoint == "ipc:///tmp/t"
        assert fourth.endpoint == "tcp://127.0.0.1:5560"  # base_port + index, index 3
        for tap in config.taps:
            assert tap.capacity == 1024
            assert tap.sample == 1.0
            assert tap.sample_by == "request"
            assert tap.models == ()
            assert tap.filters.names == ("strip-worker-pins",)
            assert tap.filters.projection_key.strip_worker_pins
        assert kv.response is None
        assert replay.response is not None
        assert (
            replay.response.tokens,
            replay.response.text,
            replay.response.max_tokens,
            replay.response.chunk_timing,
        ) == (True, False, None, False)
        assert config.capture_response

    def test_publish_host_and_base_port(self):
        config = Config.from_text(
            BASE
            + "publish: {host: 127.0.0.1, base_port: 6000}\n"
            + "taps:\n  - {name: a, capture: request}\n  - {name: b, capture: request}\n"
        )
        assert [t.endpoint for t in config.taps] == [
            "tcp://127.0.0.1:6000",
            "tcp://127.0.0.1:6001",
        ]

    def test_strip_worker_pins_stays_with_other_filters(self):
        config = Config.from_text(
            BASE + "taps:\n  - {name: a, capture: request, filters: [strip-multimodal]}\n"
        )
        (tap,) = config.taps
        assert set(tap.filters.names) == {"strip-multimodal", "strip-worker-pins"}
        assert tap.filters.projection_key.strip_worker_pins

    def test_keep_worker_pins_turns_it_off(self):
        config = Config.from_text(
            BASE + "taps:\n  - {name: a, capture: request, filters: [keep-worker-pins]}\n"
        )
        (tap,) = config.taps
        assert tap.filters.names == ("keep-worker-pins",)
        assert not tap.filters.projection_key.strip_worker_pins

    def test_sample_bounds_accepted(self):
        config = Config.from_text(
            BASE
            + "taps:\n  - {name: a, capture: request, sample: 0}\n"
            + "  - {name: b, capture: request, sample: 1}\n"
        )
        assert [t.sample for t in config.taps] == [0.0, 1.0]
