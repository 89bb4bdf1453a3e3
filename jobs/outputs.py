"""Where the jobs write, checked before anything starts (ConfigError, exit 2,
naming the option and the path): no output is, or lies in, a system folder,
however it is reached (:func:`jobs.results.dataset.system_folder`: the path
is resolved, symbolic links and all); an output directory is one this user
can create files in; a results folder is new, empty, or a lamport-lab
dataset whose files this version reads (:func:`check_results`); an output
file does not exist yet (nothing is written over a file lamport-lab did
not make), except a file appended to (``--summary-md``: a CI job summary,
which every step of a job appends to), a regular file or a new one in a
folder that exists; the dashboard's site directory is one the site builder
made (it holds ``SITE_MARKER``) or an empty one, since each build replaces
it whole; and no output lies inside another (a results dataset inside the
site would go with the next build; a trace or a copy inside the dataset
would be read as part of it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jobs.config import ConfigError
from jobs.exits import InfraError

SITE_MARKER = ".lamport-lab-site"
"""The file ``python -m dashboards build`` writes into every site it builds."""


def check_dir(flag: str, path: Path) -> Path:
    """``path`` is no system folder and is a directory this process writes
    into, or can be made one (:func:`check_writable_dir`)."""
    from jobs.results.dataset import system_refusal
    why = system_refusal(path)
    if why is not None:
        raise ConfigError(f"{flag} {why}")
    check_writable_dir(flag, path)
    return path


def check_writable_dir(flag: str, path: Path) -> None:
    """ConfigError (exit 2, before Ray starts) unless ``path`` is, or can be
    made, a directory this process writes into: its nearest existing
    ancestor must be a directory that takes a new entry (tried with a
    temporary directory, removed at once; nothing else is created)."""
    import tempfile
    path = Path(path)
    existing = path
    try:
        while not existing.exists() and existing != existing.parent:
            if existing.is_symlink():  # a dangling link: mkdir would fail on it
                raise ConfigError(f"{flag} {path}: {existing} is a broken symbolic link")
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as err:  # too long a name, no permission to look
        raise ConfigError(f"{flag} {path}: cannot look at {existing} "
                          f"({err.strerror or err})") from None
    if not is_dir:
        raise ConfigError(f"{flag} {path}: {existing} exists and is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lamport-write-check-", dir=existing))
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot create a directory under {existing} "
                          f"({err.strerror or err})") from None


def check_results(flag: str, path: Path) -> Path:
    """``path`` may take this run's rows: new, empty, or a lamport-lab
    dataset (:func:`jobs.results.dataset.refusal`: never a system folder
    or a folder of other files, nor a dataset whose marker names a newer
    schema) whose data files this version reads (:func:`unreadable_file`:
    the run's own reads after its work would fail), and writable
    (:func:`check_dir`). Only looks until the last step, whose probe
    makes and removes a temporary folder."""
    from jobs.results.dataset import real, refusal
    why = refusal(path)
    if why is None and real(path).is_dir():
        why = unreadable_file(real(path))
    if why is not None:
        raise ConfigError(f"{flag} {why}")
    return check_dir(flag, path)


def unreadable_file(root: Path) -> str | None:
    """Why one of the dataset's data files cannot be read by this version
    (:func:`jobs.results.store.read_results` would refuse it: a newer
    schema version, none, a conflicting one), or None. Reads the files'
    footers only and moves nothing (a footer that does not read is the
    reader's to quarantine, not a refusal)."""
    import warnings

    from jobs.results import store
    with warnings.catch_warnings():  # foreign files: the reader warns about them
        warnings.simplefilter("ignore", store.ForeignFileWarning)
        for directory in store.partitions(Path(root)):
            try:
                files = store.data_files(directory)
            except OSError:
                continue
            for file in files:
                try:
                    store._checked_schema(file)
                except store.ResultsError as err:
                    return str(err)
    return None


def check_new_file(flag: str, path: Path) -> Path:
    """``path`` does not exist and its directory can be written in."""
    if path.exists() or path.is_symlink():
        raise ConfigError(f"{flag} {path} exists; give a path that does not (lamport-lab "
                          f"writes over no file it did not make)")
    check_dir(f"{flag} {path}: its folder", path.parent)
    return path


def check_append_file(flag: str, path: Path) -> Path:
    """``path`` may be appended to: a regular file (or a link to one) this
    user may write, or a new file in an existing folder it may write in.
    Nothing is created here; what was there is never truncated."""
    import os
    try:
        if path.exists():
            if not path.is_file():
                raise ConfigError(f"{flag} {path} exists and is not a regular file; give a "
                                  f"file to append to, or a new one")
            if not os.access(path, os.W_OK):
                raise ConfigError(f"{flag} {path}: this user may not write to it")
            return path
        if path.is_symlink():
            raise ConfigError(f"{flag} {path} is a broken symbolic link")
        folder = path.parent
        if not folder.is_dir():
            raise ConfigError(f"{flag} {path}: its folder {folder} "
                              f"{'is not a directory' if folder.exists() else 'does not exist'}")
    except OSError as err:  # e.g. a name too long
        raise ConfigError(f"{flag} {path}: {err.strerror or err}") from None
    check_dir(f"{flag} {path}: its folder", folder)
    return path


def site_refusal(path: Path) -> str | None:
    """Why the site builder may not replace ``path`` (None: it may)."""
    if not (path.exists() or path.is_symlink()):
        return None
    if path.is_symlink() or not path.is_dir():
        return f"{path} exists and is not a directory; refusing to replace it"
    if not (path / SITE_MARKER).is_file() and any(path.iterdir()):
        return (f"{path} exists, is not empty and was not built by python -m dashboards "
                f"(no {SITE_MARKER} marker file); refusing to replace it: give a new or "
                f"empty directory")
    return None


def check_site(flag: str, path: Path) -> Path:
    """``path`` may be replaced by the next site build, and written in."""
    why = site_refusal(path)
    if why is not None:
        raise ConfigError(f"{flag} {why}")
    return check_dir(flag, path)


def check_apart(outputs: Mapping[str, Path]) -> None:
    """No output is, or lies inside, another (``{flag: path}``)."""
    items = [(flag, path, path.resolve()) for flag, path in outputs.items()]
    for i, (flag_a, a, real_a) in enumerate(items):
        for flag_b, b, real_b in items[i + 1:]:
            if real_a == real_b or real_a.is_relative_to(real_b) or \
                    real_b.is_relative_to(real_a):
                raise ConfigError(f"{flag_a} {a} and {flag_b} {b} overlap (one is, or lies "
                                  f"inside, the other); give each its own place")


def check_compile_cache() -> None:
    """InfraError (exit 3, before Ray starts) when the compile cache
    (``LAMPORT_COMPILE_CACHE``, :mod:`kernels.compile_cache`) cannot be
    used: not a folder (:func:`kernels.compile_cache.unusable`), or one in
    which no entry can be made (tried as :func:`check_dir` tries, a
    temporary folder made and removed at once). A kernel build that cannot
    store its binary is the machine's fault, not the kernel's, and must
    not be reported as failing cases."""
    from kernels.compile_cache import ENV, cache_root, unusable
    root = cache_root()
    if root is None:
        return
    given = os.environ.get(ENV)
    what = f"{ENV}={given}" if given else f"the compile cache {root}"
    hint = f"give a folder this user can write in, or {ENV}=off"
    why = unusable(root)
    if why is not None:
        raise InfraError(f"{what}: {why}; {hint}")
    try:
        check_writable_dir(ENV if given else "the compile cache", root)
    except ConfigError as err:
        raise InfraError(f"{err}; {hint}") from None
