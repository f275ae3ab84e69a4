"""The reference taps and the proxy configurations built from them, checked
against the deployment's ConfigMap and the example file so that none drifts."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from shadow_proxy.config import Config, TapConfig
from shadow_proxy.devtools.reference_taps import (
    JOINED_TAP,
    REFERENCE_TAPS,
    REQUEST_TAP,
    TAP_NAMES,
    proxy_config,
    reference_taps,
    write_config,
)

ROOT = Path(__file__).resolve().parents[3]
CONFIGMAP = ROOT / "deploy" / "kubernetes" / "base" / "configmap.yaml"
EXAMPLE = ROOT / "config" / "example.yaml"


def deployed_config() -> Config:
    configmap = yaml.safe_load(CONFIGMAP.read_text(encoding="utf-8"))
    return Config.from_text(configmap["data"]["config.yaml"], str(CONFIGMAP))


def built_config() -> Config:
    return Config.from_mapping(proxy_config("http://127.0.0.1:8000", taps=reference_taps()))


class TestSameAsTheDeployment:
    """The taps built here parse to exactly the taps of the ConfigMap and the example."""

    @pytest.mark.parametrize("where", ["configmap", "example"])
    def test_taps_equal(self, where: str) -> None:
        """Everything but where a tap binds and its keys: the deployment binds
        every interface with CURVE keys, local runs bind loopback ports."""
        other = deployed_config() if where == "configmap" else Config.from_yaml(EXAMPLE)

        def what(config: Config) -> list[TapConfig]:
            return [attrs.evolve(t, endpoint="", curve=None) for t in config.taps]

        assert what(built_config()) == what(other)

    def test_names(self) -> None:
        assert [t.name for t in built_config().taps] == list(TAP_NAMES)
        assert (REQUEST_TAP, JOINED_TAP) == TAP_NAMES
        (request, joined) = built_config().taps
        assert (request.capture, joined.capture) == ("request", "request_response")


class TestReferenceTaps:
    """Each call returns fresh mappings; endpoints are one per tap."""

    def test_endpoints_in_order(self) -> None:
        taps = reference_taps(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
        assert [t["endpoint"] for t in taps] == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]

    def test_wrong_number_of_endpoints(self) -> None:
        with pytest.raises(ValueError, match=r"one endpoint per tap \(2; got 1\)"):
            reference_taps(["tcp://127.0.0.1:1"])

    def test_changing_a_copy_changes_nothing_else(self) -> None:
        taps = reference_taps()
        taps[1]["response"]["tokens"] = False
        taps[0]["filters"].append("strip-extra-args")
        assert REFERENCE_TAPS[1]["response"]["tokens"] is True
        assert reference_taps()[0]["filters"] == ["tokens-only"]


class TestProxyConfig:
    """The builder's mapping is a valid configuration with what was asked."""

    def test_defaults(self) -> None:
        config = Config.from_mapping(proxy_config("http://127.0.0.1:9"))
        assert (config.listen.host, config.listen.port) == ("127.0.0.1", 0)
        assert config.upstream.url == "http://127.0.0.1:9"
        assert config.taps == () and config.models == ()

    def test_models_taps_and_overrides(self, tmp_path: Path) -> None:
        mapping = proxy_config(
            "http://127.0.0.1:9",
            port=8123,
            models={"m": tmp_path},
            taps=reference_taps(),
            upstream={"read_timeout_s": 1.5},
            shutdown_grace_s=5,
        )
        config = Config.from_mapping(mapping)
        assert config.listen.port == 8123
        assert config.upstream.url == "http://127.0.0.1:9"  # kept beside the override
        assert config.upstream.read_timeout_s == 1.5
        assert config.shutdown_grace_s == 5
        assert [(m.name, m.tokenizer) for m in config.models] == [("m", str(tmp_path))]
        assert [t.name for t in config.taps] == list(TAP_NAMES)

    def test_written_file_reads_back(self, tmp_path: Path) -> None:
        mapping = proxy_config("http://127.0.0.1:9", taps=reference_taps())
        path = write_config(tmp_path / "proxy.yaml", mapping)
        assert Config.from_yaml(path) == Config.from_mapping(mapping, str(path))
