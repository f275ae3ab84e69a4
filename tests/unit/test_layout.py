"""tests/unit mirrors the package file for file: every module has its test file."""

from __future__ import annotations

from pathlib import Path

from tests.support import ROOT

PACKAGE = ROOT / "shadow_proxy"
UNIT = ROOT / "tests" / "unit"


def modules() -> list[Path]:
    """Every module of the package with code in it (``__init__.py`` files only
    re-export, and are tested through the modules they name)."""
    return sorted(
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def test_every_module_has_its_test_file() -> None:
    missing = [
        str(Path("tests/unit") / m.parent / f"test_{m.name}")
        for m in modules()
        if not (UNIT / m.parent / f"test_{m.name}").is_file()
    ]
    assert not missing, f"modules without a test file of their own: {missing}"


def test_no_test_file_without_its_module() -> None:
    """A test file whose module was renamed or removed would test nothing of its name."""
    names = {m.parent / m.name for m in modules()}
    orphans = [
        str(t.relative_to(ROOT))
        for t in UNIT.rglob("test_*.py")
        if t != Path(__file__).resolve()
        and t.relative_to(UNIT).parent / t.name.removeprefix("test_") not in names
    ]
    assert not orphans, f"test files that mirror no module: {orphans}"
