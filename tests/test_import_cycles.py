"""No import cycles among the project's modules (issue 34: the loop of 7
files inside cluster/ that ran ops/spec -> measure/workloads -> cluster/cases
-> ops).

The graph is static: every .py file under the project's packages is parsed
(ast) and each import becomes an edge to the project module it loads.
``import a.b.c`` and ``from a.b import c`` load ``a.b.c`` (when it is a
module, else ``a.b``) and, first, every package above it that the importer
does not already sit in (``a.b/__init__.py``): Python runs those too.
Imports of anything outside the project are ignored; imports under ``if
TYPE_CHECKING:`` never run and are left out.

Two kinds of edge, counted apart:

- *module level*: the import runs when the module is imported (also inside
  ``if`` / ``try`` at module level). A cycle of these is an import loop:
  its order decides which module sees the other half-initialised.
- *lazy*: the import sits in a function (or a class body's method) and runs
  when it is called. Lazy imports are how a module defers torch and the
  kernels, not a licence to loop: a cycle that needs a lazy edge still
  means two modules depend on each other. Both counts must be 0.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "cluster", "jobs", "dashboards", "benchmarks")


def module_names(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``packages``
    (``a/b/__init__.py`` is module ``a.b``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, lazy) for every import statement that can run."""
    def walk(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    yield from walk_one(sub, lazy)
                continue
            yield from walk_one(child, lazy)

    def walk_one(node, lazy):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from walk(node, inner)

    yield from walk(tree, False)


def _targets(node, importer: str, is_package: bool, modules: dict) -> set[str]:
    """The project modules ``node`` (in module ``importer``) loads."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".") if is_package else importer.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                 for a in node.names]
    out = set()
    own = importer.split(".")
    for name in names:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()  # an attribute of a module, or not ours
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            # packages the importer sits in are running already
            if prefix in modules and own[:i] != parts[:i]:
                out.add(prefix)
    out.discard(importer)
    return out


def import_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES,
                 ) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, lazy edges): importer -> imported project modules."""
    modules = module_names(root, packages)
    eager: dict[str, set[str]] = {m: set() for m in modules}
    lazy: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, deferred in _imports(tree):
            (lazy if deferred else eager)[name] |= _targets(node, name, is_package, modules)
    for name in modules:
        lazy[name] -= eager[name]
    return eager, lazy


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or one
    module importing itself), each sorted; sorted by their first module
    (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def test_no_module_level_import_cycle():
    eager, _ = import_graph()
    assert cycles(eager) == []


def test_no_import_cycle_with_lazy_imports():
    eager, lazy = import_graph()
    both = {m: eager[m] | lazy[m] for m in eager}
    assert cycles(both) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_walked(package):
    assert any(m == package or m.startswith(package + ".") for m in module_names(ROOT, PACKAGES))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_planted_cycle_is_found(tmp_path):
    """The check itself: a module-level loop through a package __init__ and
    a relative import is reported; a lazy one only with the lazy edges; an
    import under TYPE_CHECKING and one of a module outside the project are
    not edges."""
    root = _tree(tmp_path, {
        "cluster/__init__.py": "",
        "cluster/ops/__init__.py": "from cluster.ops.spec import OpSpec\n",
        "cluster/ops/spec.py": "import torch\nfrom cluster.measure.workloads import builder\n",
        "cluster/measure/__init__.py": "",
        "cluster/measure/workloads/__init__.py": "from .norm import build\n",
        "cluster/measure/workloads/norm.py": "from cluster import cases\n",
        "cluster/cases.py": "from cluster import ops\n",
        "jobs/__init__.py": "",
        "jobs/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from jobs import b\n\ndef f():\n    from jobs import b\n",
        "jobs/b.py": "import jobs.a\n",
        "jobs/c.py": "import jobs.d\n",
        "jobs/d.py": "if True:\n    import jobs.c\n",
    })
    eager, lazy = import_graph(root, ("cluster", "jobs"))
    assert cycles(eager) == [
        ["cluster.cases", "cluster.measure.workloads", "cluster.measure.workloads.norm",
         "cluster.ops", "cluster.ops.spec"],
        ["jobs.c", "jobs.d"]]
    assert lazy["jobs.a"] == {"jobs.b"}
    both = {m: eager[m] | lazy[m] for m in eager}
    assert ["jobs.a", "jobs.b"] in cycles(both)
    # breaking the loop where issue 34 did: the workload no longer reads cluster.cases
    (root / "cluster/measure/workloads/norm.py").write_text("from kernels import numerics\n")
    assert cycles(import_graph(root, ("cluster", "jobs"))[0]) == [["jobs.c", "jobs.d"]]
