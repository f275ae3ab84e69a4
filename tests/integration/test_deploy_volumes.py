"""Every file the image's processes read from a Secret or ConfigMap volume is
readable by the user they run as (issue 29 item 2), in the base and every overlay.

The kubelet writes such files owned by root, group-owned by the pod's
``fsGroup`` when it has one (root otherwise), with the item's ``mode``, else
the volume's ``defaultMode``, else 0644. The image runs as uid and gid 10001
(deploy/Dockerfile's USER) unless the pod or container says otherwise. A
``defaultMode: 0440`` without ``fsGroup`` left the tap keys root:root and
unreadable: the sidecar exited 2 (``CURVE keys cannot be read``) and so did
the consumers. Rendered with test_deploy.py's kustomize loader.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import attrs
import pytest

from tests.integration.test_deploy import DEPLOY, KUBE, TREES, image_name, render

#: The image's user: USER uid:gid of deploy/Dockerfile's runtime stage.
IMAGE_USER = tuple(
    int(n)
    for n in re.search(r"(?m)^USER (\d+):(\d+)$", (DEPLOY / "Dockerfile").read_text()).groups()
)
DEFAULT_MODE = 0o644


@attrs.frozen
class Process:
    """Who a container's processes are: uid, primary gid, supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def of(cls, pod: dict[str, Any], container: dict[str, Any]) -> Process:
        pod_ctx = pod["spec"].get("securityContext", {})
        ctx = {**pod_ctx, **container.get("securityContext", {})}
        uid = ctx.get("runAsUser", IMAGE_USER[0])
        gid = ctx.get("runAsGroup", IMAGE_USER[1])
        extra = set(pod_ctx.get("supplementalGroups", []))
        if "fsGroup" in pod_ctx:
            extra.add(pod_ctx["fsGroup"])
        return cls(uid, gid, frozenset({gid, *extra}))

    def can_read(self, owner: int, group: int, mode: int) -> bool:
        if self.uid == 0:
            return True
        if self.uid == owner:
            return bool(mode & 0o400)
        if group in self.groups:
            return bool(mode & 0o040)
        return bool(mode & 0o004)


def projected_files(pod: dict[str, Any], volume: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(path in the volume, group, mode) of each file the kubelet writes for a
    Secret or ConfigMap volume (its ``items``, or one per key: ``*`` here)."""
    source = volume.get("secret") or volume.get("configMap")
    if source is None:
        return []
    group = pod["spec"].get("securityContext", {}).get("fsGroup", 0)
    default = source.get("defaultMode", DEFAULT_MODE)
    items = source.get("items") or [{"path": "*"}]
    return [(item["path"], group, item.get("mode", default)) for item in items]


def image_pods(objects: list[dict[str, Any]]):
    """(workload, pod template, container) for every container of the image."""
    for obj in objects:
        pod = obj.get("spec", {}).get("template")
        if pod is None:
            continue
        for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
            if image_name(c["image"]).rpartition("/")[2] == "shadow-proxy":
                yield f"{obj['kind']}/{obj['metadata']['name']}", pod, c


@pytest.fixture(scope="module", params=TREES, ids=lambda t: t.relative_to(KUBE).as_posix())
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_every_mounted_secret_and_config_file_is_readable(objects) -> None:
    problems, checked = [], 0
    for workload, pod, container in image_pods(objects):
        process = Process.of(pod, container)
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            for path, group, mode in projected_files(pod, volumes[mount["name"]]):
                checked += 1
                if not process.can_read(0, group, mode):
                    where = PurePosixPath(mount["mountPath"]) / path
                    problems.append(
                        f"{workload} {container['name']}: {where} is {mode:04o} root:{group}, "
                        f"unreadable by uid {process.uid} (groups {sorted(process.groups)})"
                    )
    assert checked, "no Secret or ConfigMap file is mounted by the image's containers"
    assert not problems, "\n".join(problems)


def test_the_image_runs_as_its_own_user(objects) -> None:
    """A runAsUser other than the image's would read files made for 10001."""
    for workload, pod, container in image_pods(objects):
        process = Process.of(pod, container)
        assert (process.uid, process.gid) == IMAGE_USER, f"{workload} {container['name']}"
        ctx = {**pod["spec"].get("securityContext", {}), **container.get("securityContext", {})}
        assert ctx.get("runAsNonRoot") is True, f"{workload} {container['name']}"


class TestTheRule:
    """The reading rule itself, on the case the issue reported."""

    def test_0440_without_fsgroup_is_unreadable_with_it_readable(self) -> None:
        container = {"securityContext": {"runAsUser": 10001, "runAsGroup": 10001}}
        volume = {"secret": {"secretName": "k", "defaultMode": 0o440}}
        bare = {"spec": {}}
        ((_, group, mode),) = projected_files(bare, volume)
        assert not Process.of(bare, container).can_read(0, group, mode)
        with_fs_group = {"spec": {"securityContext": {"fsGroup": 10001}}}
        ((_, group, mode),) = projected_files(with_fs_group, volume)
        assert Process.of(with_fs_group, container).can_read(0, group, mode)
