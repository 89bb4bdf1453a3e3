"""The bounds of every number a suite file or a command line may give, in
one place: the suite loader (:mod:`jobs.config`), the command-line types
(:mod:`jobs.options`), the regression rule and ``--help`` (:func:`describe`)
read them from here.

Each bound keeps a value from scaling memory or time without end, or from
overflowing where it is used (a deadline passed to Ray, a budget in
nanoseconds in a 64-bit kernel argument, a size in bytes): ``repeats`` and
``calls`` multiply the calls a case makes, ``top_k`` and ``hc`` the inputs
every rank generates (:mod:`jobs.sizing` turns those into bytes),
``replays`` the timed replays of a profile case. Memory itself is bounded
by the sizing's ceiling, not here; ``tokens`` and ``hidden`` are bounded
only by it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class Limit:
    """``low <= value <= high`` (``low`` excluded when ``open_low``)."""
    low: float
    high: float
    unit: str
    what: str
    integer: bool = False
    open_low: bool = False

    def check(self, value: object) -> float | int:
        """``value`` if it is a number (an int where ``integer``; never a
        bool) within the bounds; ValueError/TypeError saying what it must
        be otherwise (the caller names the value)."""
        if isinstance(value, bool) or not isinstance(
                value, numbers.Integral if self.integer else numbers.Real):
            raise TypeError(f"must be {'an integer' if self.integer else 'a number'} in "
                            f"{self.bounds()}")
        if not math.isfinite(value) or value < self.low or value > self.high or \
                (self.open_low and value == self.low):
            raise ValueError(f"must be in {self.bounds()}")
        return value

    def bounds(self) -> str:
        low = f"{'(' if self.open_low else '['}{_g(self.low)}"
        return f"{low}, {_g(self.high)}]{' ' + self.unit if self.unit else ''}"


def _g(x: float) -> str:
    return f"{x:,.0f}".replace(",", "_") if float(x).is_integer() else f"{x:g}"


DAY_S = 86_400.0
LIMITS: dict[str, Limit] = {
    "timeout_s": Limit(0, DAY_S, "s", "host deadline per call (suite timeout_s, --timeout)",
                       open_low=True),
    # the one budget, in the one unit, from the suite file to the kernel's
    # %globaltimer deadline (cluster.cases): integer nanoseconds, 1 us to 10 min
    "budget_ns": Limit(1_000, 600_000_000_000, "ns", "consumer watchdog budget (suite budget_ns)",
                       integer=True),
    "memory_limit_gb": Limit(0, 1 << 20, "GiB", "memory ceiling per node (memory_limit_gb, "
                             "--memory-limit-gb, LAMPORT_MEMORY_LIMIT_GB)", open_low=True),
    "repeats": Limit(1, 10_000, "", "calls per case, each with new data (a new seed)",
                     integer=True),
    "top_k": Limit(1, 128, "", "routes per token (the finalize kernel's FINALIZE_THREADS)",
                   integer=True),
    "calls": Limit(1, 10_000, "", "calls captured in one profile graph", integer=True),
    "replays": Limit(1, 1_000_000, "", "timed replays of a profile graph", integer=True),
    "min_replays": Limit(0, 1_000_000, "", "fewest replays of a longer profile graph",
                         integer=True),
    "min_replay_ms": Limit(0, 60_000, "ms", "floor on one profile replay"),
    "rotate_mb": Limit(0, 65_536, "MB", "input rotation of a profile graph (memory per rank)",
                       open_low=True),
    "wait_s": Limit(0, 3_600, "s", "head start: wait for the job agent (--wait)",
                    open_low=True),
    "num_cpus": Limit(1, 4_096, "", "head start: CPUs the head offers (--num-cpus)",
                      integer=True),
    "history": Limit(1, 1_000, "", "regression: nightly runs compared with (--history, "
                     "--min-history)", integer=True),
    "parallel": Limit(1, 1_024, "", "bisect: candidates run at once (--parallel)",
                      integer=True),
    "sigmas": Limit(0, 1_000, "", "regression: standard deviations (--sigmas)", open_low=True),
    "threshold": Limit(0, 1_000, "", "regression: fraction worse (--threshold, --min-step)"),
    "segment": Limit(1, 1_000, "", "change points: nights per segment, nights to confirm a "
                     "step (--min-segment, --confirm)", integer=True),
    "alpha": Limit(0, 1, "", "change points: significance level of a step (--alpha)",
                   open_low=True),
}


def describe() -> str:
    """The bounds, one line each, for ``--help``."""
    width = max(map(len, LIMITS))
    return "\n".join([*(f"  {name:<{width}}  {limit.bounds():<25} {limit.what}"
                        for name, limit in LIMITS.items()),
                      f"  {'op fields':<{width}}  {'(each op its own rule)':<25} e.g. hc 1..8 "
                      f"(cluster.ops: python -m jobs schema, docs/results-schema.md)"])
