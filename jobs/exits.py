"""The exit statuses of ``python -m jobs``, in one place.

Callers (nightly schedulers, ``ray job submit`` wrappers, CI) branch on
these: a red nightly (``FAILED``) is a bug in the kernels or the service;
``INFRA`` means the run could not be made (Ray did not start or could not be
reached) and says nothing about the kernels; ``USAGE`` means nothing ran.
"""

OK = 0
"""Every case passed or was skipped with its reason."""
FAILED = 1
"""A wrong element, a hang, an error or a regression."""
USAGE = 2
"""Bad command line or config; nothing was written."""
INFRA = 3
"""Infrastructure: Ray could not be started or joined (after a bounded
retry), so nothing was tested."""
INTERRUPTED_SIGINT = 130
"""Stopped by Ctrl-C (SIGINT), after the case in hand and its accounting."""
INTERRUPTED_SIGTERM = 143
"""Stopped by SIGTERM (a scheduler, ``timeout``), likewise."""
