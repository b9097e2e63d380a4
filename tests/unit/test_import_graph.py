"""The import graph's one-way rules: the rows' schema (:mod:`tuning.results`) imports nothing that chooses,
:mod:`tuning.choose` has no loop, and nothing under ``orchestrator/`` imports ``tuning``.

Read from the sources (every import statement, lazy ones in functions included), and for
:mod:`tuning.results` also in a fresh interpreter, so a loop cannot hide behind a lazy import."""
from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Modules ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _imports_package(imports: set[str], package: str) -> set[str]:
    return {m for m in imports if m == package or m.startswith(package + ".")}


def test_the_results_schema_imports_nothing_that_chooses_or_sweeps():
    imported = _imports(ROOT / "tuning" / "results.py")
    assert _imports_package(imported, "tuning.choose") == set()
    assert _imports_package(imported, "tuning.sweep") == set()


def test_importing_the_results_schema_alone_loads_neither_choose_nor_sweep():
    code = ("import sys, tuning.results; "
            "print(sorted(m for m in sys.modules if m.startswith(('tuning.choose', 'tuning.sweep'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_choose_package_has_no_import_loop():
    modules = {_module_name(p): p for p in (ROOT / "tuning" / "choose").glob("*.py")}
    graph = {name: {m for m in _imports(path, top_level_only=True) if m in modules and m != name}
             for name, path in modules.items()}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"tuning.choose imports in a loop: {e.args[1]}") from e
    assert set(order) == set(modules)


def test_nothing_under_orchestrator_imports_tuning():
    offenders = {str(p.relative_to(ROOT)): sorted(_imports_package(_imports(p), "tuning"))
                 for p in (ROOT / "orchestrator").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_one_commit_table():
    """A chosen table is written by one function: two of them drifted apart once (one path vs many)."""
    defined = [str(p.relative_to(ROOT)) for p in (ROOT / "tuning").rglob("*.py")
               if any(isinstance(n, ast.FunctionDef) and n.name == "commit_table" for n in ast.walk(ast.parse(p.read_text())))]
    assert defined == ["tuning/choose/commit.py"]
