"""Where run manifests live under a results root and how they are read:
the part of :mod:`jobs.results.runs` (which writes them) that the runs
table (:mod:`jobs.results.runs_table`, rewritten on every manifest write)
reads too; apart, so that neither of the two imports the other.

A manifest is checked as it is read (:func:`manifest_problem`): one that is
not JSON, nested past the parser's depth, not an object, or whose fields
have the wrong types (a hand edit, a disk that lost a block) is *damaged*.
:func:`read_manifest` raises :class:`ManifestError` naming the file and
what is wrong (a run is never joined or resumed on top of it);
:func:`read_manifests` leaves it out with one :class:`ManifestWarning`
line, so that listings and dashboards read on and show its rows as
``unrecorded``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import warnings
from pathlib import Path

RUNS_DIR = "_runs"

RUN_FACTS = ("git_commit", "nodes", "gpu_model", "gpu_count", "driver", "cuda", "torch",
             "cute_dsl", "ray", "pyarrow", "python", "hostname", "topology",
             "multicast_supported")
"""Results columns that are facts of the run, stored once in its manifest."""

RECORDED_STATUSES = ("running", "finished", "interrupted", "incomplete")
"""What a manifest's ``status`` may hold (``jobs.results.runs`` says what each means)."""


class ManifestError(ValueError):
    """A run manifest that cannot be used: damaged (the message names the
    file and what is wrong), ``_runs`` not a folder, or (:class:`jobs.results.lease.LeaseHeld`)
    the run driven by another live driver."""


class ManifestWarning(UserWarning):
    """A damaged manifest left out of a listing; the message names the file."""


def runs_dir(root: str | os.PathLike[str]) -> Path:
    """``ROOT/_runs``; ManifestError when it exists and is not a folder."""
    path = Path(root) / RUNS_DIR
    if os.path.lexists(path) and not path.is_dir():
        raise ManifestError(f"{path}: not a folder (the run manifests live in it); move it away")
    return path


def manifest_path(root: str | os.PathLike[str], run_id: str) -> Path:
    from kernels.validation import require_name
    return Path(root) / RUNS_DIR / f"{require_name('run_id', run_id)}.json"


def _is_time(value) -> bool:
    try:
        return isinstance(value, str) and dt.datetime.fromisoformat(value) is not None
    except ValueError:
        return False


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIELDS = {
    "trigger": (lambda v: isinstance(v, str), "a string"),
    "status": (lambda v: v in RECORDED_STATUSES, f"one of {list(RECORDED_STATUSES)}"),
    "driver": (lambda v: isinstance(v, dict) and isinstance(v.get("host"), str)
               and _is_int(v.get("pid")) and isinstance(v.get("create_time"),
                                                        (int, float, type(None))),
               '{"host": str, "pid": int, "create_time": number or null}'),
    **{name: (_is_time, "an ISO time") for name in (
        "started_at", "heartbeat_at", "finished_at", "interrupted_at")},
    "interrupted_by": (lambda v: isinstance(v, str), "a string"),
    "counts": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _is_int(n) for k, n in v.items()), "{outcome: int}"),
    "missing": (_is_int, "an int"),
    "facts": (lambda v: isinstance(v, dict), "an object"),
    "accounting": (lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
                   "a list of objects"),
    "notify": (lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
               "a list of objects"),
}
"""The typed fields of a manifest: (check, what it must be). Every one may
be absent (a bare ``ResultsWriter`` manifests its facts only), except what
a ``running`` run needs to say who drives it."""


def manifest_problem(data, run_id: str) -> str | None:
    """What is wrong with the parsed manifest ``data`` of run ``run_id``
    (None: nothing)."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    if data.get("run_id") != run_id:
        return f"run_id is {data.get('run_id')!r}, the file is named for {run_id!r}"
    for name, (check, want) in _FIELDS.items():
        if name in data and data[name] is not None and not check(data[name]):
            return f"{name} is {json.dumps(data[name], default=str)[:80]}, not {want}"
    if data.get("status") == "running":
        absent = [n for n in ("driver", "heartbeat_at") if data.get(n) is None]
        if absent:
            return f"status is running but {' and '.join(absent)} missing"
    return None


def _parse(path: Path, run_id: str) -> dict:
    """The manifest at ``path``; ManifestError when damaged, OSError when
    unreadable (FileNotFoundError: none)."""
    text = path.read_bytes()
    try:
        data = json.loads(text)
    except RecursionError:
        raise ManifestError(f"{path}: damaged run manifest (nested deeper than the JSON "
                            f"parser's limit)") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ManifestError(f"{path}: damaged run manifest (not JSON: {err})") from None
    problem = manifest_problem(data, run_id)
    if problem:
        raise ManifestError(f"{path}: damaged run manifest ({problem})")
    return data


def read_manifest(root: str | os.PathLike[str], run_id: str) -> dict | None:
    """The run's manifest, or None when none was written; ManifestError
    when it is damaged or ``_runs`` is not a folder."""
    path = runs_dir(root) / manifest_path(root, run_id).name
    try:
        return _parse(path, run_id)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ManifestError(f"{path}: unreadable run manifest ({err.strerror or err})") from None


def read_manifests(root: str | os.PathLike[str]) -> dict[str, dict]:
    """Every usable manifest under ``root``, by run id; a damaged one is
    left out with one :class:`ManifestWarning` naming it."""
    out = {}
    directory = Path(root) / RUNS_DIR
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            out[path.stem] = _parse(path, path.stem)
        except FileNotFoundError:
            continue
        except ManifestError as err:
            warnings.warn(f"{err}; its rows read as unrecorded", ManifestWarning, stacklevel=2)
        except OSError as err:
            warnings.warn(f"{path}: unreadable run manifest ({err.strerror or err}); its rows "
                          f"read as unrecorded", ManifestWarning, stacklevel=2)
    return out
