"""What the images are: built from the Debian base, run as uid 10001, no pip
or compiler, the lean one without transformers and within ~150 MB of its base,
installed from the lock files (issue 29 items 1, 3 and 5); the tools variant
runs shadow-replay and shadow-trace (issue 30's live shadow overlay)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from packaging.markers import Marker

from tests.image.conftest import Images, Podman, build_args
from tests.support import ROOT

pytestmark = pytest.mark.timeout(1200)

#: Done means for issue 29: the lean image adds at most this much to its base.
LEAN_BUDGET_MB = 150

PROBE = """
import importlib.metadata as m, importlib.util as u, json, shutil
from packaging.markers import default_environment
print(json.dumps({
    "environment": default_environment(),
    "present": [n for n in ("pip", "setuptools", "wheel", "transformers") if u.find_spec(n)],
    "tools": [t for t in ("gcc", "cc", "curl") if shutil.which(t)],
    "dists": {d.metadata["Name"].lower().replace("_", "-"): d.version for d in m.distributions()},
}))
"""


def probe(podman: Podman, image: str) -> dict:
    done = podman("run", "--rm", "--entrypoint", "python3", image, "-c", PROBE)
    return json.loads(done.stdout)


def size_mb(podman: Podman, image: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6


def locked(name: str, environment: dict[str, str]) -> dict[str, str]:
    """Package -> version the lock file pins for ``environment`` (its markers)."""
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*(.*?))?\s*\\?$", line)
        if m and (m[3] is None or Marker(m[3]).evaluate(environment)):
            pins[m[1].lower().replace("_", "-")] = m[2]
    return pins


@pytest.mark.parametrize("variant", ["lean", "full", "tools"])
def test_runs_as_uid_10001(images: Images, podman: Podman, variant: str) -> None:
    image = getattr(images, variant)
    assert podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == (
        "10001:10001"
    )
    ids = podman("run", "--rm", "--entrypoint", "id", image).stdout
    assert ids.startswith("uid=10001(shadow-proxy) gid=10001(shadow-proxy)"), ids


@pytest.mark.parametrize(
    ("variant", "lock"),
    [("lean", "image-lean.txt"), ("full", "image-full.txt"), ("tools", "image-tools.txt")],
)
def test_installed_from_the_lock_without_pip(
    images: Images, podman: Podman, variant: str, lock: str
) -> None:
    found = probe(podman, getattr(images, variant))
    assert found["tools"] == [], "no compiler, no curl"
    wanted = set() if variant == "lean" else {"transformers"}
    assert set(found["present"]) == wanted, "no pip, setuptools or wheel in the runtime"
    dists = dict(found["dists"])
    assert dists.pop("shadow-proxy") == "0.1.0"
    assert dists == locked(lock, found["environment"]), f"exactly {lock}'s packages and versions"


@pytest.mark.parametrize("variant", ["lean", "full", "tools"])
def test_the_image_holds_this_checkouts_code(images: Images, podman: Podman, variant: str) -> None:
    """Every module as the checkout has it: a cached layer must never keep old
    code (buildah 1.28 reused the install step of a changed wheel)."""
    script = (
        "import hashlib, json, pathlib, shadow_proxy; "
        "root = pathlib.Path(shadow_proxy.__file__).parent; "
        "print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() "
        "for p in root.rglob('*.py')}))"
    )
    done = podman("run", "--rm", "--entrypoint", "python3", getattr(images, variant), "-c", script)
    package = ROOT / "shadow_proxy"
    here = {
        str(p.relative_to(package)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in package.rglob("*.py")
    }
    assert json.loads(done.stdout) == here


def test_sizes(images: Images, podman: Podman) -> None:
    """Issue 29 item 5: the lean image adds at most ~150 MB to its base (it was
    362 MB on a 225 MB base, with transformers, numpy and pip)."""
    names = ("base", "lean", "full", "tools")
    sizes = {name: size_mb(podman, getattr(images, name)) for name in names}
    added = {n: sizes[n] - sizes["base"] for n in names[1:]}
    print(
        "\nimage sizes (podman image inspect): "
        + ", ".join(f"{n} {s:.0f} MB" for n, s in sizes.items())
        + "; added to the base: "
        + ", ".join(f"{n} {s:.0f} MB" for n, s in added.items())
        + "; builds: "
        + ", ".join(f"{v} {s:.0f} s" for v, s in images.build_s.items())
    )
    assert sizes["lean"] - sizes["base"] <= LEAN_BUDGET_MB


def test_the_health_check_is_kept(images: Images, podman: Podman) -> None:
    """``--format docker``: the OCI format has no HEALTHCHECK."""
    for image in (images.lean, images.full):
        test = podman("image", "inspect", "--format", "{{json .Config.Healthcheck.Test}}", image)
        assert "/opt/shadow-proxy/healthcheck.py" in test.stdout, test.stdout


def test_variant_label_and_bad_variant(images: Images, podman: Podman) -> None:
    for variant in ("lean", "full", "tools"):
        label = podman(
            "image",
            "inspect",
            "--format",
            '{{ index .Config.Labels "io.shadow-proxy.variant" }}',
            getattr(images, variant),
        )
        assert label.stdout.strip() == variant
    done = podman(*build_args("fat", "localhost/shadow-proxy:test-fat"), check=False, timeout=600)
    assert done.returncode != 0
    assert "VARIANT must be lean, full or tools (got fat)" in done.stdout + done.stderr


def test_the_tools_image_runs_the_tools(images: Images, podman: Podman) -> None:
    """The live shadow overlay's image: shadow-replay's live service and
    shadow-trace with their numeric libraries (issue 30); the sidecar's images
    stay without them."""
    script = "import numpy, numba, matplotlib, pyarrow, xxhash; print('ok')"
    done = podman("run", "--rm", "--entrypoint", "python3", images.tools, "-c", script)
    assert done.stdout.strip() == "ok"
    for tool, flag in (("shadow-replay", "--metrics-port"), ("shadow-trace", "analyze")):
        usage = podman("run", "--rm", "--entrypoint", tool, images.tools, "--help").stdout
        assert flag in usage, usage
    lean = podman("run", "--rm", "--entrypoint", "python3", images.lean, "-c", script, check=False)
    assert lean.returncode != 0, "numpy in the sidecar's image"
