"""The image lane (``make image-test``, issue 29): podman builds the image from
a Debian base made with mmdebstrap, runs it in front of the real Dynamo and
plays the manifests with ``podman kube play``.

``scripts/image-setup.sh`` installs podman and makes the base first. These
tests fail, never skip, when podman or the base is missing: the lane exists to
run them. Every container, pod, volume and secret a test makes is removed when
it ends; the images stay (tagged ``localhost/shadow-proxy:test-*``), so the
next run on the same machine reuses their layers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support import ROOT

BASE_IMAGE = os.environ.get("SHADOW_PROXY_IMAGE_BASE", "localhost/shadow-proxy-base:bookworm")
LEAN = "localhost/shadow-proxy:test-lean"
FULL = "localhost/shadow-proxy:test-full"
TOOLS = "localhost/shadow-proxy:test-tools"
#: The machine's CA bundle, handed to pip in the build (a build secret).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: What each test's `podman run` adds: the lockdown the issue asks for.
LOCKED_DOWN = ("--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.image)


class Podman:
    """``podman`` commands, and the cleanup of everything the tests made."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.containers: list[str] = []

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            msg = f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
            raise AssertionError(msg)
        return done

    def name(self, what: str) -> str:
        """A container name of its own, removed at the end of the session."""
        name = f"shadow-test-{what}-{uuid.uuid4().hex[:8]}"
        self.containers.append(name)
        return name

    def logs(self, name: str) -> str:
        done = self("logs", name, check=False)
        return done.stdout + done.stderr

    def remove_containers(self) -> None:
        if self.containers:
            self(
                "rm",
                "--force",
                "--ignore",
                "--time",
                "5",
                *self.containers,
                check=False,
                timeout=60,
            )
            self.containers.clear()


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    binary = shutil.which("podman")
    if binary is None:
        pytest.fail("podman is not installed: run scripts/image-setup.sh (make image-test)")
    if not os.environ.get("CONTAINERS_CONF"):
        pytest.fail("CONTAINERS_CONF is unset: run the lane with make image-test")
    tool = Podman(binary)
    if tool("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        pytest.fail(f"no base image {BASE_IMAGE}: run scripts/image-setup.sh")
    yield tool
    tool.remove_containers()


@attrs.frozen
class Images:
    lean: str
    full: str
    #: full and the tools extra: shadow-replay as the live shadow service, shadow-trace.
    tools: str
    base: str
    #: Wall seconds each variant's build took (cached layers make it short).
    build_s: dict[str, float]


def build_args(variant: str, tag: str) -> list[str]:
    """``podman build`` of deploy/Dockerfile from the lane's base, as
    docs/deploying.md gives it (the same arguments reuse the same layers)."""
    args = ["build", "--format", "docker", "--network", "host"]
    args += ["--build-arg", f"BASE={BASE_IMAGE}", "--build-arg", f"VARIANT={variant}"]
    if CA_BUNDLE.is_file():
        args += ["--secret", f"id=ca.crt,src={CA_BUNDLE}"]
    return [*args, "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", tag, str(ROOT)]


def build(podman: Podman, tag: str, variant: str, log: Path) -> float:
    """Build one variant; its seconds. Fails with the build's last lines."""
    start = time.monotonic()
    done = podman(*build_args(variant, tag), timeout=900, check=False)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        pytest.fail(f"podman build ({variant}) exited {done.returncode}:\n{tail}", pytrace=False)
    return time.monotonic() - start


@pytest.fixture(scope="session")
def images(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Images:
    """The three variants, built from the Debian base (the build is the first check:
    it failed on any Debian base before issue 29)."""
    logs = tmp_path_factory.mktemp("builds")
    seconds = {
        variant: build(podman, tag, variant, logs / f"{variant}.log")
        for variant, tag in (("lean", LEAN), ("full", FULL), ("tools", TOOLS))
    }
    return Images(LEAN, FULL, TOOLS, BASE_IMAGE, seconds)


def run_detached(
    podman: Podman,
    what: str,
    image: str,
    args: list[str],
    *,
    entrypoint: str | None = None,
    volumes: dict[Path, str] | None = None,
) -> str:
    """``podman run -d`` locked down, on the host network; the container's name."""
    name = podman.name(what)
    command = ["run", "-d", "--name", name, "--network", "host", *LOCKED_DOWN]
    for source, target in (volumes or {}).items():
        command += ["-v", f"{source}:{target}"]
    if entrypoint is not None:
        command += ["--entrypoint", entrypoint]
    podman(*command, image, *args)
    return name


def running(podman: Podman, name: str) -> bool:
    state = podman("inspect", "--format", "{{.State.Running}}", name, check=False)
    return state.stdout.strip() == "true"


async def wait_ready(podman: Podman, name: str, url: str, timeout: float = 60) -> float:
    """Poll ``url`` (the proxy's /readyz) until it answers 200; fails with the
    container's log if it exits first. Returns the seconds it took."""
    import aiohttp

    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except (aiohttp.ClientError, TimeoutError):
                pass
            if not running(podman, name):
                pytest.fail(f"{name} exited before it was ready:\n{podman.logs(name)[-3000:]}")
            if time.monotonic() - start > timeout:
                pytest.fail(f"{url} not ready within {timeout} s:\n{podman.logs(name)[-3000:]}")
            await asyncio.sleep(0.05)
