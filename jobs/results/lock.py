"""The dataset's compaction lock: readers share it, a compaction's swap takes
it alone (:mod:`jobs.results.compaction` states the protocol).

Two files locked with ``flock`` (names starting with ``_``: Parquet readers
skip them): ``ROOT/_compaction.lock``, held shared by each read for the
whole read (listing, footers, rows) and exclusively by a compaction only
while it swaps its new file in (a rename and a few unlinks: milliseconds),
never while it reads or writes rows; and ``ROOT/_compaction.turnstile``,
which a compaction holds exclusively while it waits for the reads in
progress to end, so that new reads wait behind it instead of starving it
(readers pass the turnstile shared, for an instant, on their way in). The
first compaction makes both files; a reader makes none (where they are
missing it reads unlocked, and reads again, locked, if a compaction made
them meanwhile: ``jobs.results.store.read_results``). The
kernel drops a lock when its holder dies, ``kill -9`` included, so none is
ever stale. Writers take neither: a new file appears by one rename, which
a reader sees whole or not at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "_compaction.lock"
TURNSTILE_FILE = "_compaction.turnstile"
READ_WAIT_S = 60.0
"""How long a reader waits for a compaction's swap before it gives up."""
POLL_S = 0.01


class LockTimeout(Exception):
    """The lock was not had within the wait (a compaction's process stopped
    mid-swap, say)."""


def _open(root: Path, name: str, *, create: bool) -> int | None:
    """A descriptor on a lock file (made when missing with ``create``);
    None when there is none (a dataset no compaction has touched) or it
    cannot be opened."""
    try:
        return os.open(Path(root) / name,
                       os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    except OSError:
        return None


def _acquire(fd: int, mode: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


@contextlib.contextmanager
def _fds(root: Path, *, create: bool) -> Iterator[tuple[int | None, int | None]]:
    fds = (_open(root, TURNSTILE_FILE, create=create), _open(root, LOCK_FILE, create=create))
    try:
        yield fds
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)  # drops its lock


@contextlib.contextmanager
def shared(root: Path, wait_s: float = READ_WAIT_S) -> Iterator[bool]:
    """Hold the lock shared for the block; yields whether it is held (False
    where the lock files do not exist: no compaction has run there, and a
    reader makes no file; :func:`exists` tells it afterwards whether one
    began meanwhile). LockTimeout after ``wait_s``."""
    with _fds(root, create=False) as (turnstile, main):
        if turnstile is None or main is None:
            yield False
            return
        deadline = time.monotonic() + wait_s
        if not _acquire(turnstile, fcntl.LOCK_SH, deadline) or \
                not _acquire(main, fcntl.LOCK_SH, deadline):
            raise LockTimeout(f"{Path(root) / LOCK_FILE}: a compaction held it for more than "
                              f"{wait_s:g} s")
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield True


@contextlib.contextmanager
def exclusive(root: Path, wait_s: float) -> Iterator[bool]:
    """Hold the lock alone for the block; yields False (and holds nothing)
    when it was not had within ``wait_s``."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with _fds(root, create=True) as (turnstile, main):
        deadline = time.monotonic() + wait_s
        yield (turnstile is not None and main is not None
               and _acquire(turnstile, fcntl.LOCK_EX, deadline)
               and _acquire(main, fcntl.LOCK_EX, deadline))


def exists(root: Path) -> bool:
    return (Path(root) / LOCK_FILE).is_file()
