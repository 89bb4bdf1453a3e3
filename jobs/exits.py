"""The exit statuses of ``python -m jobs``, in one place.

Callers (nightly schedulers, ``ray job submit`` wrappers, CI) branch on
these: a red nightly (``FAILED``) is a bug in the kernels or the service;
``INFRA`` means the run could not be made (Ray did not start or could not be
reached) and says nothing about the kernels; ``USAGE`` means nothing ran.
``python -m jobs --help`` and the README's table are made from ``MEANING``
(:func:`help_text`, :func:`markdown_table`; tests/test_docs_commands.py
checks the README's).

Two exceptions carry a status up to ``jobs.__main__.main``:
:class:`InfraError` (one line on stderr, exit ``INFRA``) and
:class:`Interrupted` (SIGINT or SIGTERM in the main thread, a ``SystemExit``
so that ``except Exception`` never swallows it and every ``finally`` runs).
"""

from __future__ import annotations

import signal

OK = 0
FAILED = 1
USAGE = 2
INFRA = 3
INTERRUPTED_SIGINT = 130
INTERRUPTED_SIGTERM = 143

MEANING: dict[int, str] = {
    OK: "every case passed, or was skipped with its reason",
    FAILED: "a wrong element, a hang, an error or a regression; or no case ran at all "
            "(every one skipped, or none selected on this cluster) without --allow-empty",
    USAGE: "bad command line or config; checked before Ray starts, nothing ran or was written",
    INFRA: "infrastructure: Ray could not be started or reached (after a bounded retry), "
           "so nothing was tested",
    INTERRUPTED_SIGINT: "stopped by Ctrl-C (SIGINT) after the case in hand: closing line, "
                        "accounting, run marked interrupted, the --resume command printed",
    INTERRUPTED_SIGTERM: "stopped by SIGTERM (a scheduler, timeout), the same way",
}
"""What each status means, for --help and the README."""

_BY_SIGNAL = {signal.SIGINT: INTERRUPTED_SIGINT, signal.SIGTERM: INTERRUPTED_SIGTERM}


class InfraError(RuntimeError):
    """The run could not be made: Ray did not start, or nothing answered
    at the address given. Its message is one line naming what failed."""

    status = INFRA


class Interrupted(SystemExit):
    """SIGINT or SIGTERM ended the driver (raised by
    ``jobs.embedded.terminate_raises``); ``code`` is its exit status."""

    def __init__(self, signum: int) -> None:
        if signum not in _BY_SIGNAL:
            raise ValueError(f"signum: SIGINT or SIGTERM, got {signum!r}")
        super().__init__(_BY_SIGNAL[signum])
        self.signum = signum

    @property
    def name(self) -> str:
        """``SIGINT`` or ``SIGTERM``."""
        return signal.Signals(self.signum).name


def help_text(width: int = 79) -> str:
    """The statuses as ``--help`` shows them, one per status, wrapped."""
    import textwrap
    return "\n".join(textwrap.fill(text, width, initial_indent=f"  {code:<5}",
                                    subsequent_indent=" " * 7)
                     for code, text in MEANING.items())


def markdown_table() -> str:
    """The statuses as the README's table."""
    return "\n".join(["| exit | meaning |", "| --- | --- |",
                      *(f"| {code} | {text} |" for code, text in MEANING.items())])
