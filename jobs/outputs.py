"""Where the jobs write, checked before anything starts (ConfigError, exit 2,
naming the option and the path): an output directory is one this user can
create files in; an output file does not exist yet (nothing is written over
a file lamport-lab did not make), except a file appended to
(``--summary-md``: a CI job summary, which every step of a job appends
to), a regular file or a new one in a folder that exists; the dashboard's
site directory is one the site builder made (it holds ``SITE_MARKER``) or
an empty one, since each build replaces it whole; and no output lies
inside another (a results dataset inside the site would go with the next
build; a trace or a copy inside the dataset would be read as part of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from jobs.config import ConfigError

SITE_MARKER = ".lamport-lab-site"
"""The file ``python -m dashboards build`` writes into every site it builds."""


def check_dir(flag: str, path: Path) -> Path:
    """``path`` is a directory this process writes into, or can be made one
    (:func:`jobs.options.check_writable_dir`)."""
    from jobs.options import check_writable_dir
    check_writable_dir(flag, path)
    return path


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
