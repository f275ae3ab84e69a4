"""tests/unit mirrors the package file for file: every module has its test file
(in tests/integration when every test of it needs a real server, as the JetStream
link and source do: the unit tests run without one)."""

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


def mirror_of(module: Path) -> Path:
    return UNIT / module.parent / f"test_{module.name}"


def covered(module: Path) -> bool:
    """``test_<module>.py``, or the module's tests split by topic into
    ``test_<module>_<topic>.py`` files beside it (a file that mirrors another
    module, such as ``test_jetstream_tap.py`` beside ``jetstream.py``, is that
    module's, not a topic of this one)."""
    stem = module.name.removesuffix(".py")
    folder = UNIT / module.parent
    siblings = {p.stem for p in (PACKAGE / module.parent).glob("*.py")}
    topics = [
        t for t in folder.glob(f"test_{stem}_*.py") if t.stem.removeprefix("test_") not in siblings
    ]
    integration = ROOT / "tests" / "integration"
    elsewhere = list(integration.glob(f"test_{stem}.py")) + list(
        integration.glob(f"test_{stem}_*.py")
    )
    return mirror_of(module).is_file() or bool(topics) or bool(elsewhere)


def test_every_module_has_its_test_file() -> None:
    missing = [str(mirror_of(m).relative_to(ROOT)) for m in modules() if not covered(m)]
    assert not missing, f"modules without a test file of their own: {missing}"


def test_no_test_file_without_its_module() -> None:
    """A test file whose module was renamed or removed would test nothing of its
    name; a topic file names its module first (``test_<module>_<topic>.py``)."""
    names = {m.parent / m.name.removesuffix(".py") for m in modules()}

    def mirrors(test: Path) -> bool:
        relative = test.relative_to(UNIT)
        words = relative.stem.removeprefix("test_").split("_")
        return any(relative.parent / "_".join(words[:k]) in names for k in range(len(words), 0, -1))

    orphans = [
        str(t.relative_to(ROOT))
        for t in UNIT.rglob("test_*.py")
        if t != Path(__file__).resolve() and not mirrors(t)
    ]
    assert not orphans, f"test files that mirror no module: {orphans}"


def import_cycles(*packages: str) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others
    (strongly connected components of the import graph, imports under
    ``TYPE_CHECKING`` included: a circle there is still a circle)."""
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_circles() -> None:
    """Neither the package nor the benchmarks has modules that import each other."""
    assert import_cycles("shadow_proxy", "bench") == []


#: A module does one job: past this many lines it is split (issue 33).
MAX_MODULE_LINES = 400
#: ``# fmt: skip`` is for a table clearer by hand (bucket bounds), a handful at most.
MAX_FMT_SKIPS = 20


def test_no_module_over_the_line_bound() -> None:
    long = {
        str(m): n
        for m in modules()
        if (n := len((PACKAGE / m).read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them"


def test_the_formatter_formats() -> None:
    skips = [
        f"{p.relative_to(ROOT)}:{i}"
        for folder in ("shadow_proxy", "tests", "bench")
        for p in (ROOT / folder).rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if line.rstrip().endswith("# fmt" + ": skip")
    ]
    assert len(skips) <= MAX_FMT_SKIPS, skips
