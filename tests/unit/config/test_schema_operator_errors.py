"""Configuration mistakes an operator makes (issue 17 items 6 to 8): each is an
error that names the file, the line(s) and the key, never a silent change."""

from __future__ import annotations

from shadow_proxy.config import Config
from tests.support.config_files import BASE, load, rejected


class TestDuplicateKeys:
    """A key given twice in one mapping is an error naming both lines."""

    def test_two_port_lines(self, tmp_path):
        message = rejected(tmp_path, BASE + "listen:\n  port: 8080\n  host: x\n  port: 9090\n")
        assert message.startswith(f"{tmp_path / 'proxy.yaml'}:7: 'port' "), message
        assert "lines 5 and 7" in message

    def test_two_taps_blocks(self, tmp_path):
        text = BASE + "taps:\n  - {name: a, capture: request}\nlisten: {}\ntaps: []\n"
        message = rejected(tmp_path, text)
        assert message.startswith(f"{tmp_path / 'proxy.yaml'}:7: 'taps' "), message
        assert "lines 4 and 7" in message

    def test_inside_a_tap(self, tmp_path):
        text = BASE + "taps:\n  - name: a\n    capture: request\n    name: b\n"
        message = rejected(tmp_path, text)
        assert "'name'" in message and "lines 5 and 7" in message, message

    def test_the_same_key_in_two_mappings_is_fine(self, tmp_path):
        config = load(tmp_path, BASE + "listen: {port: 1}\npublish: {base_port: 2}\n")
        assert (config.listen.port, config.publish.base_port) == (1, 2)


class TestTapModels:
    """A tap's ``models`` entry must be a configured model: else it never mirrors."""

    def test_unknown_model(self, tmp_path):
        text = BASE + (
            "models:\n  - {name: deepseek, tokenizer: /t}\n"
            "taps:\n  - name: a\n    capture: request\n    models: [deepseek, deepseak]\n"
        )
        message = rejected(tmp_path, text)
        assert message.startswith(f"{tmp_path / 'proxy.yaml'}:9: 'taps[a].models' "), message
        assert "'deepseak' is not one" in message and "models: deepseek" in message

    def test_no_models_configured(self, tmp_path):
        text = BASE + "taps:\n  - {name: a, capture: request, models: [m]}\n"
        assert "(models: none)" in rejected(tmp_path, text)

    def test_configured_models_pass(self, tmp_path):
        text = BASE + (
            "models:\n  - {name: m, tokenizer: /t}\n"
            "taps:\n  - {name: a, capture: request, models: [m]}\n"
        )
        assert load(tmp_path, text).taps[0].models == ("m",)


class TestTokenizerPaths:
    """Relative tokenizer paths are read from the configuration file's directory."""

    def test_relative_to_the_file_not_the_working_directory(self, tmp_path, monkeypatch):
        (tmp_path / "conf" / "models" / "m").mkdir(parents=True)
        monkeypatch.chdir(tmp_path)  # the working directory has no models/
        config = load(
            tmp_path / "conf",
            BASE + "models:\n  - {name: a, tokenizer: models/m}\n  - {name: b, tokenizer: ./x}\n",
        )
        assert config.models[0].tokenizer == str(tmp_path / "conf" / "models" / "m")
        # Shaped like a path: a path even when missing (the worker says it is missing).
        assert config.models[1].tokenizer == str(tmp_path / "conf" / "x")

    def test_hub_ids_stay_hub_ids(self, tmp_path):
        config = load(tmp_path, BASE + "models:\n  - {name: a, tokenizer: org/model}\n")
        assert config.models[0].tokenizer == "org/model"

    def test_absolute_paths_stay(self, tmp_path):
        config = load(tmp_path, BASE + "models:\n  - {name: a, tokenizer: /abs/m}\n")
        assert config.models[0].tokenizer == "/abs/m"


class TestWhere:
    """``Config.where`` names the line of a key for errors found after reading."""

    def test_keys_and_their_sections(self, tmp_path):
        text = BASE + (
            "listen:\n  host: 127.0.0.1\n  port: 8080\n"
            "models:\n  - name: m\n    tokenizer: /t\n"
            "taps:\n  - name: a\n    capture: request\n"
        )
        config = load(tmp_path, text)
        path = tmp_path / "proxy.yaml"
        assert config.where("listen.port") == f"{path}:6: 'listen.port'"
        assert config.where("models[0].tokenizer") == f"{path}:9: 'models[0].tokenizer'"
        # No endpoint key: the tap's own line.
        assert config.where("taps[a].endpoint") == f"{path}:11: 'taps[a].endpoint'"


def test_the_example_file_works_from_any_directory(tmp_path, monkeypatch):
    """config/example.yaml names the repository's model directory from wherever it is read."""
    from tests.support import ROOT

    monkeypatch.chdir(tmp_path)
    config = Config.from_yaml(ROOT / "config" / "example.yaml")
    assert config.models[0].tokenizer == str(ROOT / ".models" / "deepseek")
    assert config.publish.host == "127.0.0.1"


class TestCurveKeys:
    """``curve`` belongs to ZeroMQ taps; its paths are read from the file's directory."""

    def test_paths_relative_to_the_file(self, tmp_path):
        text = BASE + (
            "taps:\n  - name: a\n    capture: request\n"
            "    curve: {server_secret_key: keys/s.key_secret, client_keys: keys/allowed}\n"
        )
        curve = load(tmp_path, text).taps[0].curve
        assert curve.server_secret_key == str(tmp_path / "keys" / "s.key_secret")
        assert curve.client_keys == str(tmp_path / "keys" / "allowed")

    def test_not_on_a_nats_tap(self, tmp_path):
        text = BASE + (
            "nats: {servers: ['nats://127.0.0.1:4222']}\n"
            "taps:\n  - name: a\n    capture: request\n    transport: nats\n"
            "    curve: {server_secret_key: s, client_keys: c}\n"
        )
        message = rejected(tmp_path, text)
        assert "'taps[a].curve' is only for ZeroMQ taps (transport is 'nats')" in message
