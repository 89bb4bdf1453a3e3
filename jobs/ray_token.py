"""Ray's token files (token authentication): made when missing, otherwise
only read, and checked before Ray is started or asked.

A token file is one line: the token, ``TOKEN_PATTERN`` (printable ASCII
without spaces; the ones made here are 64 hex digits), at least
``MIN_PRIVATE`` characters in a file this side's cluster uses. lamport-lab never changes a file it finds: one that is
not a regular file of yours, that others may read or write, or that holds
anything else (a note, a key of another kind) is a :class:`ConfigError`
(exit 2) naming the path and what to do, before anything starts. A FIFO or
device is refused without being opened for a blocking read.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from jobs.config import ConfigError

TOKEN_PATTERN = re.compile(r"[!-~]{1,1024}")
MIN_PRIVATE = 16
"""Fewest characters of a token the embedded cluster or a head is started with."""
MAX_BYTES = 4096


def make(path: Path) -> Path:
    """A new token file at ``path``: 32 random bytes as hex, created 0600
    (never widened; its folder, when made here, 0700). FileExistsError
    when ``path`` exists."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def ensure(path: Path, what: str) -> Path:
    """``path`` made (:func:`make`) when missing, else checked (:func:`read`)."""
    try:
        return make(path)
    except FileExistsError:
        read(path, what)
        return path
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot create it: {err.strerror or err}") from None


def read(path: Path, what: str, *, private: bool = True) -> str:
    """The token in ``path``; ConfigError naming ``what`` and the path when
    it is not a regular file, is not yours or (``private``) others may read
    or write it, or does not hold one token."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot open it: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is not a regular file; give a token file")
        if private and st.st_uid != os.getuid():
            raise ConfigError(f"{what} {path} belongs to uid {st.st_uid}, not to you "
                              f"(uid {os.getuid()}); use a token file of your own")
        if private and st.st_mode & 0o077:
            raise ConfigError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: others "
                              f"may read or change it; `chmod 600` it if it is a token file "
                              f"(lamport-lab changes no file it did not make)")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    shortest = MIN_PRIVATE if private else 1
    if len(data) > MAX_BYTES or not TOKEN_PATTERN.fullmatch(text) or len(text) < shortest:
        raise ConfigError(f"{what} {path} does not hold a token (one line of {shortest} to "
                          f"1024 printable characters, no spaces); point it at a token file, "
                          f"or at a path that does not exist yet to have one made there")
    return text
