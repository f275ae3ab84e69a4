"""tests/unit mirrors the package file for file: every module has its test file."""

from __future__ import annotations

from pathlib import Path

from tests.support import ROOT

PACKAGE = ROOT / "shadow_proxy"
UNIT = ROOT / "tests" / "unit"

#: Modules that arrived (issues 12, 14, 15) after tests/unit was laid out, still
#: without a unit test file of their own; tested end to end in tests/integration
#: meanwhile. The list may only shrink: a module listed here that gains its
#: test file fails ``test_pending_list_is_current`` until it leaves the list.
PENDING = {
    "records/jetstream_source.py",
    "replay/cli.py",
    "replay/report.py",
    "replay/runner.py",
    "trace/cli.py",
    "trace/kernels.py",
    "trace/report.py",
    "trace/selection.py",
    "worker/publishers/jetstream.py",
    "worker/publishers/jetstream_metrics.py",
    "worker/publishers/jetstream_stream.py",
    "worker/publishers/jetstream_tap.py",
}


def modules() -> list[Path]:
    """Every module of the package with code in it (``__init__.py`` files only
    re-export, and are tested through the modules they name)."""
    return sorted(
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def mirror_of(module: Path) -> Path:
    return UNIT / module.parent / f"test_{module.name}"


def test_every_module_has_its_test_file() -> None:
    missing = [
        str(mirror_of(m).relative_to(ROOT))
        for m in modules()
        if not mirror_of(m).is_file() and str(m) not in PENDING
    ]
    assert not missing, f"modules without a test file of their own: {missing}"


def test_pending_list_is_current() -> None:
    names = {str(m) for m in modules()}
    assert names >= PENDING, f"pending modules that no longer exist: {PENDING - names}"
    done = sorted(p for p in PENDING if mirror_of(Path(p)).is_file())
    assert not done, f"these have their test file now; take them off PENDING: {done}"


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
