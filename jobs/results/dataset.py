"""What makes a folder a lamport-lab results dataset.

One predicate, :func:`looks_like_dataset`, for every reader that must not
take an arbitrary folder (``--results /etc``) for an empty dataset.
"""

from __future__ import annotations

from pathlib import Path

from jobs.results.run_files import RUNS_DIR

MARKER = "_lamport_dataset.json"
"""The file a results folder holds from its creation on."""


def looks_like_dataset(path: Path) -> bool:
    """Whether ``path`` is a lamport-lab results dataset: it holds the
    dataset marker ``MARKER``, a ``_runs`` folder of run manifests, or a
    hive partition ``date=*/suite=*``. An empty folder is not one (a new
    dataset is: the caller decides whether to accept an empty folder)."""
    path = Path(path)
    try:
        if (path / MARKER).is_file() or (path / RUNS_DIR).is_dir():
            return True
        return any(p.is_dir() for p in path.glob("date=*/suite=*"))
    except OSError:
        return False
