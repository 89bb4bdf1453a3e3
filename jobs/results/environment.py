"""What the process runs on, as results columns, collected without a GPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]
_DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
_DRIVER_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]*)")
_DISTRIBUTIONS = {"torch": "torch", "pyarrow": "pyarrow", "ray": "ray",
                  "cute_dsl": "nvidia-cutlass-dsl"}


def env_info(git_timeout_s: float = 2.0) -> dict[str, Any]:
    """Environment columns for a results row, e.g. ``make_row(**env_info(), ...)``.

    Keys (all results columns): git_commit, hostname, python, torch, pyarrow,
    ray, cute_dsl, cuda, gpu_count, gpu_model, driver. A value that cannot be
    found is None. Package versions come from installed metadata and the CUDA
    fields from torch's version file and nvidia-smi (nothing is imported;
    ``gpu_count`` 0 where no GPU is listed), the driver from
    /proc/driver/nvidia/version. Cluster-wide columns (nodes, topology,
    multicast_supported) are left to the caller.
    """
    info: dict[str, Any] = {
        "git_commit": git_commit(git_timeout_s),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
    }
    info.update({column: _version(dist) for column, dist in _DISTRIBUTIONS.items()})
    info.update(_cuda_info())
    return info


def env_info_soon() -> Callable[[], dict[str, Any]]:
    """:func:`env_info` started now on a thread of its own (it waits on git
    and nvidia-smi: a job gathers it while it connects to Ray); the
    returned function waits for it and returns it (raising what it raised)."""
    from concurrent.futures import Future

    future: Future = Future()

    def gather() -> None:
        try:
            future.set_result(env_info())
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            future.set_exception(err)

    threading.Thread(target=gather, name="env-info", daemon=True).start()
    return future.result


GIT_COMMIT_ENV = "LAMPORT_GIT_COMMIT"


def git_commit(timeout_s: float = 2.0) -> str | None:
    """The commit the code came from: ``$LAMPORT_GIT_COMMIT`` when set, else
    HEAD's SHA of the checkout holding this package; None outside git.

    Under ``ray job submit --working-dir`` the uploaded tree has no .git:
    the submitting side passes the commit in LAMPORT_GIT_COMMIT
    (``python -m jobs submit`` does; by hand: ``--runtime-env-json
    '{"env_vars": {"LAMPORT_GIT_COMMIT": "<sha>"}}'``).
    """
    given = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if given:
        return given
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_info() -> dict[str, Any]:
    """cuda (the CUDA torch was built with), gpu_count, gpu_model (the GPUs
    nvidia-smi lists on this host; 0 where it lists none) and driver; {}
    when torch is not installed. Nothing is imported: a driver that only
    submits work needs no torch (seconds of start-up; the cluster's own GPU
    columns come from its topology)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return {}
    info: dict[str, Any] = {"cuda": _torch_cuda(Path(spec.origin).with_name("version.py"))}
    names = _gpu_names()
    info["gpu_count"] = len(names)
    if names:
        info.update(gpu_model=names[0], driver=_driver_version())
    return info


_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)


def _torch_cuda(version_py: Path) -> str | None:
    """``torch.version.cuda`` read from torch's version.py (None: a CPU build)."""
    try:
        match = _TORCH_CUDA.search(version_py.read_text())
    except OSError:
        return None
    return (match.group(1) or match.group(2)) if match else None


def _gpu_names(timeout_s: float = 10.0) -> list[str]:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [n.strip() for n in done.stdout.splitlines() if n.strip()] if done.returncode == 0 else []


def _driver_version() -> str | None:
    try:
        text = _DRIVER_VERSION_FILE.read_text()
    except OSError:
        return None
    match = _DRIVER_VERSION.search(text)
    return match.group(1) if match else None
