"""Layers import only downward: kernels <- cluster <- jobs <- dashboards
(docs/architecture.md, issue 15). Every .py file of those packages is parsed (ast) and
each import, at module level or inside a function, is checked: none may
name a package above its own, nor ``benchmarks`` (commands over the
harness, never imported by the service)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("kernels", "cluster", "jobs", "dashboards")
FORBIDDEN_EVERYWHERE = ("benchmarks",)


def imported_packages(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in ``tree``; relative
    imports resolve to ``package``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            top = package if node.level else (node.module or "").split(".")[0]
            found.append((node.lineno, top))
    return found


def violations(root: Path = ROOT) -> list[str]:
    bad = []
    for level, package in enumerate(LAYERS):
        above = set(LAYERS[level + 1:]) | set(FORBIDDEN_EVERYWHERE)
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, name in imported_packages(tree, package):
                if name in above:
                    bad.append(f"{path.relative_to(root)}:{line} ({package}) imports {name}")
    return bad


def test_no_import_points_up_a_layer_or_at_benchmarks():
    assert violations() == []


def test_the_walk_finds_upward_imports(tmp_path):
    """The check itself: planted upward imports (module level, in a function,
    a from-import) are all reported; a downward one is not."""
    for package in LAYERS:
        (tmp_path / package).mkdir()
    (tmp_path / "cluster" / "bad.py").write_text(
        "import kernels.lamport\nfrom jobs.config import Case\n\n"
        "def f():\n    import dashboards.build\n    from benchmarks import int_list\n")
    (tmp_path / "jobs" / "ok.py").write_text("from cluster import group\nfrom . import config\n")
    found = violations(tmp_path)
    assert found == ["cluster/bad.py:2 (cluster) imports jobs",
                     "cluster/bad.py:5 (cluster) imports dashboards",
                     "cluster/bad.py:6 (cluster) imports benchmarks"]


@pytest.mark.parametrize("package", LAYERS)
def test_every_layer_is_walked(package):
    assert list((ROOT / package).rglob("*.py")), f"no .py files under {package}/"
