"""Where a TP group's ranks run: the one set of placement names.

A :class:`Placement` is a ``str`` (``enum.StrEnum``), so a member is its
value wherever a string goes: the results' ``placement`` column, the
``--placement`` option and the suites' ``placement =`` key, the
``topology`` column's layouts. ``auto`` is not a placement but a request
for the best one a cluster offers (``jobs.config.PLACEMENTS``).
"""

from __future__ import annotations

import enum


class Placement(enum.StrEnum):
    PROCESS_PER_GPU = "process-per-gpu"
    """One rank process a GPU; the only placement whose timings are a
    collective's speed."""
    SHARED_GPU = "shared-gpu"
    """tp rank processes on one GPU, each with ``1 / tp`` of it."""
    VIRTUAL_RANKS = "virtual-ranks"
    """tp ranks in one process on one GPU (``kernels`` ``VirtualRanks``)."""
    EMULATED = "emulated"
    """Rank processes without a GPU: the Lamport protocol in numpy."""

    @classmethod
    def _missing_(cls, value: object) -> Placement | None:
        # The underscore spelling (process_per_gpu) that cluster/ used until
        # 2026-12: stored topology JSON and benchmarks' --kinds still carry it.
        if isinstance(value, str) and "_" in value:
            return cls.__members__.get(value.upper())
        return None

