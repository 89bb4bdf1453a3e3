"""Where run manifests live under a results root and how they are read:
the part of :mod:`jobs.results.runs` (which writes them) that the runs
table (:mod:`jobs.results.runs_table`, rewritten on every manifest write)
reads too; apart, so that neither of the two imports the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RUNS_DIR = "_runs"

RUN_FACTS = ("git_commit", "nodes", "gpu_model", "gpu_count", "driver", "cuda", "torch",
             "cute_dsl", "ray", "pyarrow", "python", "hostname", "topology",
             "multicast_supported")
"""Results columns that are facts of the run, stored once in its manifest."""


def manifest_path(root: str | os.PathLike[str], run_id: str) -> Path:
    from kernels.validation import require_name
    return Path(root) / RUNS_DIR / f"{require_name('run_id', run_id)}.json"


def read_manifest(root: str | os.PathLike[str], run_id: str) -> dict | None:
    """The run's manifest, or None (none written, or unreadable)."""
    try:
        return json.loads(manifest_path(root, run_id).read_text())
    except (OSError, ValueError):
        return None


def read_manifests(root: str | os.PathLike[str]) -> dict[str, dict]:
    """Every readable manifest under ``root``, by run id."""
    out = {}
    for path in sorted((Path(root) / RUNS_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("run_id"), str):
            out[data["run_id"]] = data
    return out
