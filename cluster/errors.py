"""Errors in words: what a row, a log line or another error says of one."""

from __future__ import annotations


def error_text(err: BaseException, limit: int = 400) -> str:
    """``Type: message`` of the root cause (a RayTaskError's ``cause``, not
    Ray's wrapper with its traceback header), on one line, at most ``limit``
    characters."""
    cause = getattr(err, "cause", None) or err
    text = " ".join(f"{type(cause).__name__}: {cause}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
