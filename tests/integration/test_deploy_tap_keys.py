"""The deployment's taps authenticate (issue 18 item 9): a sidecar whose taps
bind every interface has CURVE on every tap, with its keys mounted from a
Secret where the config says; each example consumer gets the tap's public key
and its own key pair from a Secret and passes them to the shared source
arguments. Rendered with test_deploy.py's kustomize loader."""

from __future__ import annotations

import argparse
import shlex
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from shadow_proxy.records import sources
from tests.integration.test_deploy import BASE, find, render

PROXY = "shadow-proxy"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(BASE)


def secret_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Mounted path -> (Secret name, key) for every Secret item the container mounts."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert "items" in secret, f"{mount['name']}: mount Secret keys by items, explicitly"
        for item in secret["items"]:
            path = PurePosixPath(mount["mountPath"]) / item["path"]
            files[str(path)] = (secret["secretName"], item["key"])
    return files


def test_every_tap_on_all_interfaces_has_curve_keys_from_a_secret(objects):
    config = yaml.safe_load(
        find(objects, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
    )
    pod = find(objects, "Deployment", "llm-frontend")["spec"]["template"]
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == PROXY)
    files = secret_files(pod, proxy)
    assert config["publish"]["host"] == "0.0.0.0"
    for tap in config["taps"]:
        curve = tap.get("curve")
        assert curve, f"tap {tap['name']} binds every interface without CURVE"
        assert curve["server_secret_key"] in files, curve
        assert files[curve["server_secret_key"]][1].endswith(".key_secret")
        clients = [
            p for p in files if PurePosixPath(p).parent == PurePosixPath(curve["client_keys"])
        ]
        assert clients and all(p.endswith(".key") for p in clients), (curve, files)
    # No Secret object in the base: keys are created by the operator, never committed.
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_consumers_pass_their_keys_to_the_source_arguments(objects):
    pod = find(objects, "Deployment", "shadow-consumer")["spec"]["template"]
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e["value"] for e in container["env"]}
        parser = argparse.ArgumentParser()
        parser.add_argument("--interval")
        sources.add_arguments(parser, files_allowed=False)
        args = parser.parse_args(shlex.split(env["CONSUMER_ARGS"]))
        files = secret_files(pod, container)
        assert args.curve_server_key in files and args.curve_client_key in files, container["name"]
        assert files[args.curve_server_key][1] == "server.key"  # the public half only
        assert files[args.curve_client_key][1].endswith(".key_secret")
