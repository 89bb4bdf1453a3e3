"""What a results folder is: a lamport-lab dataset, a new or empty folder,
or something else that lamport-lab neither writes into nor reads as one.

A dataset is recognised by its marker, ``ROOT/_lamport_dataset.json``
(:data:`MARKER`; a name starting with ``_``, so Parquet readers skip it),
which :class:`jobs.results.store.ResultsWriter` writes with its first rows
(:func:`write_marker`): ``{"lamport_lab": "results dataset", "format": 1,
"schema_version": N, "created_at": ISO}``, ``schema_version`` the newest
schema version that has written into it. A dataset made before the marker
existed is recognised by what only the store makes: a run manifest folder
``_runs/`` or a hive partition ``date=*/suite=*/``; its first write adds
the marker. :func:`looks_like_dataset` is that predicate, the one place it
is decided (the jobs' output checks and the dashboards' readers ask it).

A system folder is never a dataset, and never an output of lamport-lab,
however it is reached (the path is resolved first, so a symbolic link to
``/`` or ``/etc`` is the folder it points at): see :data:`SYSTEM_TREES`
and :data:`SYSTEM_FOLDERS` and :func:`system_folder`. Nothing here walks
more than a folder and its ``date=*`` children, so a link to ``/`` never
leads into ``/proc``.

:func:`refusal` says why a results folder may not be written (a system
folder, not a directory, a non-empty folder that is no dataset, a marker
of a newer schema version than this lamport-lab reads); the jobs call it,
and check the data files' versions (:func:`jobs.outputs.check_results`),
before Ray starts, so a run that could not record or read its rows never
begins.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path

from jobs.results.atomic import write_atomically
from jobs.results.run_files import RUNS_DIR
from jobs.results.schema import SCHEMA_VERSION

MARKER = "_lamport_dataset.json"
"""The file that makes a folder a lamport-lab dataset."""
MARKER_FORMAT = 1
MAX_MARKER_BYTES = 1 << 16

SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/run", "/sbin", "/sys", "/usr", "/var/backups", "/var/cache",
                "/var/lock", "/var/log", "/var/mail", "/var/run", "/var/spool")
"""Folders of the operating system: neither they nor anything inside them
is a results folder or any other output (``/usr/local`` included)."""
SYSTEM_FOLDERS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var",
                  "/var/lib", "/var/opt", "/var/tmp", "/var/www")
"""Folders that hold other people's folders: not an output themselves, but
a folder made inside one is fine (``/tmp/results``, ``/var/tmp/x``,
``/var/www/lamport-lab`` as deploy/ray-up/nightly.sh's site)."""


def real(path: Path) -> Path:
    """``path`` absolute with every symbolic link resolved (the parts that
    do not exist yet kept as given): the folder a write would reach."""
    return Path(os.path.realpath(os.path.abspath(path)))


def system_folder(path: Path) -> Path | None:
    """The system folder (:data:`SYSTEM_TREES`, :data:`SYSTEM_FOLDERS`)
    that ``path``, resolved, is or lies in; None when it is none. A folder
    that does not exist yet directly in ``/`` counts as lying in ``/``
    (lamport-lab makes no top-level folder; an existing one, a mount such
    as ``/data``, is the administrator's and may be given)."""
    resolved = real(path)
    for tree in SYSTEM_TREES:
        if resolved.is_relative_to(tree):
            return Path(tree)
    if str(resolved) in SYSTEM_FOLDERS:
        return resolved
    if resolved.parent == Path("/") and not os.path.lexists(resolved):
        return Path("/")
    return None


def looks_like_dataset(path: Path) -> bool:
    """Whether ``path`` (resolved) is a lamport-lab results dataset: a
    directory that is no system folder and holds the :data:`MARKER` file,
    or, made before the marker, a ``_runs/`` folder or a hive partition
    ``date=*/suite=*/``. Only ``path``'s entries and those of its
    ``date=*`` folders are listed (no walk); an unreadable folder is not a
    dataset. Never raises for a path that cannot be listed."""
    resolved = real(path)
    if system_folder(resolved) is not None or not resolved.is_dir():
        return False
    try:
        with os.scandir(resolved) as entries:
            top = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                   for e in entries]
    except OSError:
        return False
    if any(name == MARKER and is_file for name, _, is_file in top) or \
            any(name == RUNS_DIR and is_dir for name, is_dir, _ in top):
        return True
    for name, is_dir, _ in top:
        if is_dir and name.startswith("date="):
            try:
                with os.scandir(resolved / name) as entries:
                    if any(e.name.startswith("suite=") and e.is_dir(follow_symlinks=False)
                           for e in entries):
                        return True
            except OSError:
                continue
    return False


def read_marker(root: Path) -> dict | None:
    """The marker's content (None: no marker); ValueError naming the file
    when it is not a marker lamport-lab wrote (not a small regular file of
    JSON with an integer ``schema_version``)."""
    path = Path(root) / MARKER
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the dataset marker ({err.strerror or err})") \
            from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: the dataset marker is not a regular file")
        raw = os.read(fd, MAX_MARKER_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw) if len(raw) <= MAX_MARKER_BYTES else None
    except (ValueError, RecursionError):
        data = None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"{path}: not a dataset marker lamport-lab wrote (JSON with an "
                         f"integer schema_version); remove it if this folder is a dataset")
    return data


def write_marker(root: Path) -> None:
    """Mark ``root`` (a dataset being written by this version) as a dataset:
    the marker is written when missing, and its ``schema_version`` raised
    to :data:`SCHEMA_VERSION` when lower (written whole or not at all;
    writers racing write the same content). A marker that does not read is
    left alone: :func:`refusal` names it before the next run."""
    root = Path(root)
    try:
        data = read_marker(root)
    except ValueError:
        return
    if data is not None and data["schema_version"] >= SCHEMA_VERSION:
        return
    data = {"lamport_lab": "results dataset", "format": MARKER_FORMAT,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            **(data or {}), "schema_version": SCHEMA_VERSION}
    text = json.dumps(data, sort_keys=True, indent=1).encode()
    write_atomically(root / MARKER, lambda sink: sink.write(text))


def system_refusal(path: Path) -> str | None:
    """``"PATH is [inside ]the system folder S; ..."`` when ``path``,
    resolved, is or lies in a system folder (:func:`system_folder`), else
    None: the one wording of that refusal, for every output."""
    resolved = real(path)
    system = system_folder(resolved)
    if system is None:
        return None
    return (f"{_shown(path, resolved)} is {'' if system == resolved else 'inside '}the system "
            f"folder {system}; give a folder of your own")


def _shown(path: Path, resolved: Path) -> str:
    """``path``, and what it resolves to where that differs."""
    return str(path) if resolved == Path(os.path.abspath(path)) else f"{path} (= {resolved})"


def refusal(path: Path) -> str | None:
    """Why lamport-lab may not write its rows into ``path`` (None: it may):
    ``path`` resolves into a system folder; it exists and is not a
    directory; it is a directory that is neither empty nor a dataset
    (:func:`looks_like_dataset`); its marker does not read or names a
    newer schema version. Lists one folder and reads the marker; writes
    nothing. (Its data files' versions: :func:`jobs.outputs.unreadable_file`.)"""
    path = Path(path)
    why = system_refusal(path)
    if why is not None:
        return why
    resolved = real(path)
    where = _shown(path, resolved)
    if not resolved.exists():
        return None
    if not resolved.is_dir():
        return f"{where} exists and is not a directory"
    try:
        with os.scandir(resolved) as entries:
            empty = next(entries, None) is None
    except OSError as err:
        return f"{where}: cannot list it ({err.strerror or err})"
    if empty:
        return None
    if not looks_like_dataset(resolved):
        return (f"{where} is not empty and is not a lamport-lab results dataset (no {MARKER}, "
                f"no {RUNS_DIR}/, no date=*/suite=* partition); give a new or empty folder, "
                f"or the dataset's own")
    try:
        marker = read_marker(resolved)
    except ValueError as err:
        return str(err)
    if marker is not None and marker["schema_version"] > SCHEMA_VERSION:
        return (f"{where}: dataset of schema version {marker['schema_version']} (its {MARKER}), "
                f"newer than this lamport-lab's {SCHEMA_VERSION}; update lamport-lab")
    return None
