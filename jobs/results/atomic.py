"""One file written whole or not at all: a hidden temporary file in the same
folder, fsynced, renamed (or linked) into place, the folder fsynced."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_hidden(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write what ``write(sink)`` writes to a new hidden file next to
    ``path`` (its name starts with '.' and ends in '.tmp', so dataset
    readers skip it), fsynced; returns that file, for :func:`publish`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as sink:
            write(sink)
            sink.flush()
            os.fsync(sink.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def publish(temp: Path, path: Path, *, overwrite: bool = True) -> Path:
    """Give the whole file ``temp`` (from :func:`write_hidden`) the name
    ``path`` in one step, durably. ``overwrite=False``: FileExistsError
    when ``path`` exists (a hard link, which never replaces), and ``temp``
    is removed either way."""
    try:
        if overwrite:
            os.replace(temp, path)
        else:
            os.link(temp, path)
            temp.unlink()
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def write_atomically(path: Path, write: Callable[[IO[bytes]], None], *,
                     overwrite: bool = True) -> Path:
    """Create ``path`` with what ``write(sink)`` writes; a reader sees the
    old file (or none) or the whole new one, never a part. ``overwrite=False``:
    FileExistsError instead of replacing a file that is there."""
    return publish(write_hidden(path, write), path, overwrite=overwrite)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
