"""One op-name list (issue 34): the registry (:mod:`cluster.ops`) is the only
place the project's code enumerates its ops. Every job, page and check asks
the registry (``ops.names()``, ``ops.collective()``, ``op = "*"`` in a
suite); no module under the project's packages or scripts/ spells a
collection of two or more op names. Suites may still select subsets of ops
(a sweep's ``op = [...]``): that is a choice of cases, not a second list of
what exists."""

from __future__ import annotations

import ast
from pathlib import Path

from cluster import ops

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "cluster", "jobs", "dashboards", "benchmarks", "scripts")


def op_name_collections(path: Path, names: set[str]) -> list[int]:
    """Lines of every literal tuple / list / set of >= 2 strings, or dict with
    >= 2 string keys, that are all op names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        values = [e.value for e in items if isinstance(e, ast.Constant)]
        if len(values) >= 2 and len(values) == len(items) and all(
                isinstance(v, str) and v in names for v in values):
            found.append(node.lineno)
    return found


def test_the_registry_is_the_only_op_name_list(tmp_path):
    names = set(ops.names())
    lists = [f"{path.relative_to(ROOT)}:{line}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for line in op_name_collections(path, names)]
    assert lists == [], f"op names listed outside the registry: {lists}"
    # the scan finds what it looks for
    probe = tmp_path / "probe.py"
    probe.write_text('OPS = ("all_reduce_norm", "indexer")\nCOLOUR = {"embed_norm": 1, '
                     '"all_reduce_mhc": 2}\nONE = ("all_reduce_norm", "other")\n')
    assert op_name_collections(probe, names) == [1, 2]
