"""``podman kube play`` of the rendered podman-test overlay (issue 29): the
serving pod (mock frontend from the full image, the sidecar from the lean one)
comes up ready and serves; the example consumers' pod receives every record.

podman 4.3 mounts Secret volumes wrongly (values left base64-encoded,
``items`` and ``defaultMode`` ignored), so the test writes each Secret's
files as the kubelet would (its items, its modes, owner root, group the pod's
fsGroup or root) and mounts that directory by hostPath: a mode the image's
user cannot read fails here as in a cluster (with ``defaultMode: 0440`` and
no fsGroup the sidecar exited 2). The model volume's claim is a podman volume
of the claim's name. docs/deploying.md lists what kube play ignores.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
import zmq.auth

from shadow_proxy.devtools.processes import wait_until
from tests.image.conftest import Images, Podman
from tests.integration.test_deploy import KUBE, render
from tests.support import MODELS_DIR

pytestmark = pytest.mark.timeout(600)

OVERLAY = KUBE / "overlays" / "podman-test"
PROXY_URL = "http://127.0.0.1:28080"
PORTS = (28000, 28080, 28557, 28558)
REQUESTS = 6


def assert_ports_free() -> None:
    """Nothing listens there (TIME_WAIT from a previous run is fine: the
    servers bind with SO_REUSEADDR, as this check does)."""
    for port in PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                pytest.fail(f"port {port} (the podman-test overlay's) is taken: {e}")


def make_keys(directory: Path) -> dict[str, dict[str, bytes]]:
    """Fresh CURVE keys, as the two Secrets of deploy/README.md hold them."""
    directory.mkdir()
    zmq.auth.create_certificates(str(directory), "server")
    zmq.auth.create_certificates(str(directory), "consumer")
    read = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    return {
        "shadow-proxy-tap-keys": {
            "server.key_secret": read["server.key_secret"],
            "consumer.key": read["consumer.key"],
        },
        "shadow-consumer-keys": {
            "server.key": read["server.key"],
            "consumer.key_secret": read["consumer.key_secret"],
        },
    }


def write_secret_volume(pod: dict[str, Any], volume: dict[str, Any], data, root: Path) -> Path:
    """The files the kubelet writes for a Secret volume; their directory."""
    secret = volume["secret"]
    group = pod["spec"].get("securityContext", {}).get("fsGroup", 0)
    mode = secret.get("defaultMode", 0o644)
    items = secret.get("items") or [{"key": k, "path": k} for k in data[secret["secretName"]]]
    root.mkdir(parents=True)
    for item in items:
        path = root / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[secret["secretName"]][item["key"]])
        os.chown(path, 0, group)
        path.chmod(item.get("mode", mode))
    return root


def playable(objects: list[dict[str, Any]], keys, scratch: Path) -> list[dict[str, Any]]:
    """The rendered objects with each Secret volume written out and mounted by hostPath."""
    out = copy.deepcopy(objects)
    for obj in out:
        pod = obj.get("spec", {}).get("template")
        for volume in (pod or {}).get("spec", {}).get("volumes", []):
            if "secret" in volume:
                where = scratch / obj["metadata"]["name"] / volume["name"]
                directory = write_secret_volume(pod, volume, keys, where)
                volume.pop("secret")
                volume["hostPath"] = {"path": str(directory), "type": "Directory"}
    return out


def volume_names(objects: list[dict[str, Any]]) -> list[str]:
    """Named volumes kube play makes: one per ConfigMap, one per claim."""
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"]
    for obj in objects:
        for volume in obj.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                names.append(volume["persistentVolumeClaim"]["claimName"])
    return names


def containers_of(podman: Podman, pod: str) -> dict[str, dict[str, Any]]:
    """Container name (as in the manifest) -> podman's inspect of it."""
    listed = podman("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}").stdout.split()
    found = {}
    for name in listed:
        if name.endswith("-infra"):
            continue
        (inspect,) = json.loads(podman("inspect", name).stdout)
        found[name.removeprefix(f"{pod}-")] = inspect
    return found


def consumer_summaries(podman: Podman, container: str) -> list[dict[str, Any]]:
    """The launcher's children's summaries (SUMMARY_DIR, rewritten every second)."""
    listing = podman("exec", container, "ls", "/var/lib/shadow-consumer", check=False)
    summaries = []
    for name in listing.stdout.split():
        text = podman("exec", container, "cat", f"/var/lib/shadow-consumer/{name}", check=False)
        try:
            summaries.append(json.loads(text.stdout))
        except ValueError:  # written atomically, but the container may be going
            continue
    return summaries


async def test_kube_play_comes_up_ready_serves_and_records(
    images: Images, podman: Podman, tmp_path: Path
) -> None:
    objects = render(OVERLAY)
    pods = {f"{o['metadata']['name']}-pod-0" for o in objects if o["kind"] == "Deployment"}
    volumes = volume_names(objects)
    play = tmp_path / "play.yaml"
    play.write_text(yaml.safe_dump_all(playable(objects, make_keys(tmp_path / "keys"), tmp_path)))
    assert_ports_free()
    # kube down (4.3) leaves the volumes; a stale one would serve an old config.
    podman("volume", "rm", "--force", *volumes, check=False)
    podman("volume", "create", "model-store")
    mountpoint = podman("volume", "inspect", "--format", "{{.Mountpoint}}", "model-store")
    shutil.copytree(MODELS_DIR / "deepseek", Path(mountpoint.stdout.strip()) / "example-model")
    try:
        started = time.monotonic()
        podman("kube", "play", str(play), timeout=180)
        up_s, ready_s = await wait_pod_ready(podman, pods, started)
        print(
            f"\nkube play to the sidecar's /healthz 200: {up_s:.2f} s, to /readyz 200 "
            f"(the mock frontend answering too): {ready_s:.2f} s"
        )

        sidecar = containers_of(podman, "llm-frontend-pod-0")["shadow-proxy"]
        assert sidecar["Config"]["User"] == "10001:10001" or sidecar["Config"]["User"] == "10001"
        assert sidecar["HostConfig"]["ReadonlyRootfs"] is True
        assert sidecar["EffectiveCaps"] in (None, [])

        # Both consumer containers write to the pod's one SUMMARY_DIR volume.
        consumers = containers_of(podman, "shadow-consumer-pod-0")
        reader = consumers["shadow-replay"]["Name"]

        def totals(what: str) -> dict[str, int]:
            return {s["topic"]: s[what] for s in consumer_summaries(podman, reader)}

        def subscribed() -> bool:
            beats = {
                s["topic"]: sum(p["heartbeats"] for p in s["publishers"])
                for s in consumer_summaries(podman, reader)
            }
            return len(beats) == 2 and all(beats.values())

        await wait_until(subscribed, 60, interval=0.5, what="both consumers' first heartbeat")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            for i in range(REQUESTS):
                body = {
                    "model": "example-model",
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                    "max_tokens": 4,
                }
                async with session.post(PROXY_URL + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["usage"]["completion_tokens"] == 4

        await wait_until(
            lambda: all(n >= REQUESTS for n in totals("records").values()),
            60,
            interval=0.5,
            what="the records at both consumers",
        )
        assert totals("records") == {"kv-history-tracker": REQUESTS, "shadow-replay": REQUESTS}
        assert set(totals("tap_gaps").values()) == {0}
        async with aiohttp.ClientSession() as session:
            async with session.get(PROXY_URL + "/metrics") as r:
                metrics = await r.text()
        for tap in ("kv-history-tracker", "shadow-replay"):
            found = re.search(rf'(?m)^shadow_tap_published_total{{tap="{tap}"}} (\S+)$', metrics)
            assert found and float(found[1]) == REQUESTS, tap
    finally:
        podman("kube", "down", str(play), check=False, timeout=180)
        podman("volume", "rm", "--force", *volumes, check=False)


async def wait_pod_ready(
    podman: Podman, pods: set[str], started: float, timeout: float = 90
) -> tuple[float, float]:
    """Until the sidecar's /readyz answers 200; fails with the pods' logs as
    soon as the sidecar has exited (podman restarts it: restartPolicy Always).
    Returns the seconds to its first /healthz 200 (the sidecar serves) and to
    /readyz 200 (its frontend answers too)."""

    def fail(why: str) -> None:
        logs = {
            name: podman.logs(inspect["Name"])[-1500:]
            for pod in sorted(pods)
            for name, inspect in containers_of(podman, pod).items()
        }
        pytest.fail(f"{why}; logs: {json.dumps(logs, indent=1)}", pytrace=False)

    up = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            try:
                if up is None:
                    async with session.get(PROXY_URL + "/healthz") as response:
                        up = time.monotonic() - started if response.status == 200 else None
                async with session.get(PROXY_URL + "/readyz") as response:
                    if response.status == 200:
                        return up or 0.0, time.monotonic() - started
            except (aiohttp.ClientError, TimeoutError):
                pass
            sidecar = containers_of(podman, "llm-frontend-pod-0").get("shadow-proxy", {})
            if sidecar.get("RestartCount") or sidecar.get("State", {}).get("ExitCode"):
                fail("the sidecar exited")
            if time.monotonic() - started > timeout:
                fail(f"the sidecar was not ready within {timeout} s")
            await asyncio.sleep(0.1)
