"""Host time inside a case, by phase: where a correctness, fault or profile
case's seconds go beyond its kernels (issue 16 asks <= 0.15 s a case).

A rank backend times its call with a :class:`PhaseClock` and returns
``host_ns`` (phase -> ns) in its result (``cluster.backend``); the group
keeps, per call, the slowest rank's time of each phase (ranks run at once,
so the slowest is what the call waits for: :func:`slowest`) and sums them
over its calls (``TPGroup.phases_s``). Phases, in a call's order:

``inputs``    the case's inputs made on the host (``cluster.cases.case_inputs``);
              where a helper thread made them and the reference during the
              call before (:mod:`cluster.ahead`: the GPU backend's batches
              and virtual ranks), the wait for it
``load``      copied to the device and the stage state read (GPU backend)
``call``      publish and consume, to the end of the device's work
``readback``  error buffer, outputs and the mailbox check read back
``check``     the outputs against the op's torch reference (CPU; only the
              comparison where the reference was made ahead)

and for a profile case (:mod:`cluster.measure.timing`; per implementation
the slowest rank, summed over the implementations) ``inputs`` (the
workload's rotation sets), ``check`` and

``graph``     capture, warm-up, the barriers and the timed replays

(its build, compile or load and first call, is the rows' ``compile_s`` and
the job's kernel preparation).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

PHASES = ("inputs", "load", "call", "readback", "check", "graph")


class PhaseClock:
    """Consecutive phases of one call: ``mark(name)`` ends the phase begun at
    the previous mark (or at construction); ``ns`` maps phase -> ns."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self._last = time.monotonic_ns()

    def mark(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        now = time.monotonic_ns()
        self.ns[phase] = self.ns.get(phase, 0) + now - self._last
        self._last = now


def slowest(per_rank: Iterable[Mapping[str, int] | None]) -> dict[str, float]:
    """One call's phases in seconds, each the largest over the ranks that
    reported it (None or a result without ``host_ns``: skipped)."""
    out: dict[str, float] = {}
    for ns in per_rank:
        for phase, value in (ns or {}).items():
            out[phase] = max(out.get(phase, 0.0), value / 1e9)
    return out


def add(total: dict[str, float], phases: Mapping[str, float]) -> dict[str, float]:
    """``total`` += ``phases`` (seconds, by phase), in place; returns it."""
    for phase, seconds in phases.items():
        total[phase] = total.get(phase, 0.0) + float(seconds)
    return total


def since(before: Mapping[str, float], now: Mapping[str, float]) -> dict[str, float]:
    """What a running total (``TPGroup.phases_s``) grew by since a copy of it."""
    return {p: now[p] - before.get(p, 0.0) for p in now if now[p] > before.get(p, 0.0)}


def rounded(phases: Mapping[str, float], digits: int = 4) -> dict[str, float]:
    """The phases in :data:`PHASES` order, rounded (for rows and manifests)."""
    return {p: round(phases[p], digits) for p in PHASES if p in phases}


def describe(phases: Mapping[str, float]) -> str:
    """``inputs 1.2 s, call 0.4 s, check 3.1 s`` in :data:`PHASES` order."""
    return ", ".join(f"{p} {phases[p]:.1f} s" for p in PHASES if p in phases)
