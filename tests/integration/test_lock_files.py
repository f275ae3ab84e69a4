"""The lock files in requirements/ (``make lock``) cover pyproject.toml.

``make`` installs the dev venv from dev.txt and the image from image-lean.txt or
image-full.txt, with hash checking; a dependency added to pyproject.toml
without ``make lock`` would be missing there (the venv install or the image's
``pip check`` fails later, far from the cause). Offline: the files are read,
not resolved again.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import ROOT

REQUIREMENTS = ROOT / "requirements"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = canonicalize_name(PROJECT["name"])
#: Lock file -> the extras of pyproject.toml it must cover (besides the core).
LOCKS = {
    "dev.txt": ["dev"],
    "image-lean.txt": [],
    "image-full.txt": ["jinja2"],
    "image-tools.txt": ["jinja2", "tools"],
}

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(path: Path) -> dict[str, set[str]]:
    """Package -> pinned versions (a universal lock may pin two, by marker)."""
    found: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            found.setdefault(canonicalize_name(m[1]), set()).add(m[2])
    return found


def direct(extras: list[str]) -> list[Requirement]:
    """The core requirements plus those of ``extras``, self-references expanded."""
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == NAME:
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_direct_dependency_is_pinned_within_its_bounds(lock: str) -> None:
    locked = pins(REQUIREMENTS / lock)
    problems = []
    for req in direct(LOCKS[lock]):
        versions = locked.get(canonicalize_name(req.name))
        if not versions:
            problems.append(f"{req.name} is not in {lock}")
        problems += [
            f"{req.name}=={v} is outside {req}"
            for v in versions or ()
            if not req.specifier.contains(v, prereleases=True)
        ]
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_has_a_hash(lock: str) -> None:
    text = (REQUIREMENTS / lock).read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[-1])
    unhashed = [e.split()[0] for e in entries if PIN.match(e) and "--hash=sha256:" not in e]
    assert not unhashed


def test_the_images_run_the_versions_the_tests_ran() -> None:
    """image-*.txt are resolved within dev.txt's pins (scripts/lock.sh)."""
    dev = pins(REQUIREMENTS / "dev.txt")
    for lock in ("image-lean.txt", "image-full.txt", "image-tools.txt"):
        differ = {n: v for n, v in pins(REQUIREMENTS / lock).items() if dev.get(n) != v}
        assert not differ, f"{lock} pins differ from dev.txt: {differ}"


def test_the_lean_image_has_no_transformers() -> None:
    assert "transformers" not in pins(REQUIREMENTS / "image-lean.txt")
    assert "transformers" in pins(REQUIREMENTS / "image-full.txt")


def test_the_build_backend_is_locked() -> None:
    build = pins(REQUIREMENTS / "build.txt")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in requires:
        req = Requirement(text)
        versions = build.get(canonicalize_name(req.name), set())
        assert versions and all(req.specifier.contains(v) for v in versions), (
            f"{req} in build.txt: {versions}"
        )
    assert "pip" in build
