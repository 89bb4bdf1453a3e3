"""One file written whole or not at all: a hidden temporary file in the same
folder, fsynced, renamed into place, the folder fsynced."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Create ``path`` with what ``write(sink)`` writes; a reader sees the
    old file (or none) or the whole new one, never a part. The temporary
    name starts with '.' and ends in '.tmp', so dataset readers skip it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as sink:
            write(sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
