"""How a test brings an op package as its authors would: installed by pip
into a temporary folder (the op registered by the entry point of the
installed dist-info), then ``python -m jobs`` in a subprocess with that
folder on the path, so that every process of a run (the driver and its
rank actors) finds the op the same way. Used by tests/test_example_op.py
(examples/scaled_allreduce) and tests/test_adding_an_op_guide.py (the
package docs/adding-an-op.md builds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_SOURCES = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
"""What a package folder holds that is not its source (pip's in-tree build)."""


def pip_install(source: Path, target: Path) -> Path:
    """``source`` installed into ``target`` by pip, from a copy (pip builds
    in the tree it is given), no index, no dependencies (lamport-lab is the
    checkout), no build isolation (setuptools from this environment)."""
    copy = target.with_name(target.name + "-src")
    shutil.copytree(source, copy, ignore=NOT_SOURCES)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                           "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
                           "--target", str(target), str(copy)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def environment(*path: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``path`` and the checkout on
    PYTHONPATH, no Ray address to join (each run starts its own cluster) and
    no plug-in modules."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)]), **extra}
    for name in ("RAY_ADDRESS", "LAMPORT_OP_MODULES"):
        env.pop(name, None)
    return env


def jobs(site: Path, *argv: str, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    """``python -m jobs ARGV`` from the checkout with ``site`` on the path."""
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=REPO,
                          env=environment(site, **extra), capture_output=True, text=True,
                          timeout=timeout)


def repository_status() -> str:
    """``git status`` of the checkout, untracked files listed one by one:
    equal before and after a run when the run wrote no file of it."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
