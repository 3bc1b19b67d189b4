"""The product code's import graph: no circles, and analysis/ never imports the training code.

The graph is read from the source (``ast``), function-level imports included: a circle
hidden in a function body is still a circle. An import of ``a.b.c`` counts as an edge to
``a.b.c`` only (not to the packages above it, which Python imports first by design).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gtopk", "analysis", "baselines")


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (anywhere in its body)."""
    mods = modules(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods] + ([base] if any(t not in mods for t in subs) else [])
            else:
                continue
            for target in targets:
                while target and target not in mods:  # `import a.b.func`-style: the nearest module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_detector_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from . import b\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.c"] == {"pkg.b"}  # a relative import resolves to the module
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_product_code_has_no_import_circle():
    assert cycles(import_graph(ROOT)) == []


def test_analysis_reads_records_and_the_model_never_the_training_code():
    graph = import_graph(ROOT)
    offending = {m: sorted(t for t in ts if t.startswith("gtopk.train")) for m, ts in graph.items()}
    assert {m: ts for m, ts in offending.items() if m.startswith("analysis") and ts} == {}
