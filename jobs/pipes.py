"""Standard output and error that outlive their reader.

``python -m jobs schema | head -1``: ``head`` exits after one line and the
next write to the pipe raises BrokenPipeError (Python ignores SIGPIPE).
Left alone it would end the command in a traceback, or, in a sweep, end
the run half-way because its table could not be printed. Within
:func:`outliving_readers` a write or flush that finds its reader gone
points that stream's file descriptor at ``/dev/null`` instead and carries
on: what nobody reads is dropped, the command finishes, and its exit
status is its own (0 for ``schema``; a sweep's verdict for a sweep), with
no traceback and no "Exception ignored" at exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


class _Outliving:
    """A text stream whose writes survive the reader's going away."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _gone(self) -> None:
        """Send the rest to /dev/null (the descriptor, so that what is still
        buffered, and children sharing it, go there too)."""
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return  # not a file (a test's StringIO): nothing to repoint
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            with contextlib.suppress(BrokenPipeError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def outliving_readers() -> Iterator[None]:
    """Within: ``sys.stdout`` and ``sys.stderr`` survive a reader that has
    gone (see the module docstring); both are flushed, and put back, on
    the way out."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Outliving(saved[0]), _Outliving(saved[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        sys.stdout, sys.stderr = saved
