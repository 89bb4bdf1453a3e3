"""Statistics of per-iteration times (microseconds); no torch."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def stats(times_us: Sequence[float]) -> dict[str, float]:
    """The results' timing columns of per-iteration times (us): ``t_n``,
    ``t_min_us``, ``t_median_us``, ``t_mean_us``, ``t_p90_us``, ``t_p99_us``
    (nearest rank), ``t_stdev_us`` (sample; 0 for one time)."""
    if not times_us:
        raise ValueError("stats of no times")
    ordered = sorted(float(t) for t in times_us)
    n = len(ordered)

    def pct(q: float) -> float:
        return ordered[min(n - 1, max(0, round(q * (n - 1))))]

    return {"t_n": n, "t_min_us": ordered[0], "t_median_us": statistics.median(ordered),
            "t_mean_us": statistics.fmean(ordered), "t_p90_us": pct(0.90),
            "t_p99_us": pct(0.99), "t_stdev_us": statistics.stdev(ordered) if n > 1 else 0.0}


def median_p10_p90(times_us: Sequence[float]) -> tuple[float, float, float]:
    """``(median, p10, p90)`` of per-call times (the benchmark tables)."""
    if len(times_us) < 2:
        raise ValueError(f"median_p10_p90 needs at least 2 times, got {len(times_us)}")
    q = statistics.quantiles(times_us, n=10)
    return statistics.median(times_us), q[0], q[-1]


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the slowest rank's time (nccl-tests' convention: every
    rank timed the same number of replays, each started after a barrier)."""
    if not per_rank:
        raise ValueError("max_over_ranks of no ranks")
    counts = {len(t) for t in per_rank}
    if len(counts) != 1:
        raise ValueError(f"ranks timed different replay counts: {sorted(counts)}")
    return [max(ts) for ts in zip(*per_rank)]


def bandwidth(bytes_moved: int, bus_factor: float, t_us: float) -> dict[str, float]:
    """nccl-tests' ``algbw`` (bytes / time) and ``busbw`` (algbw x the
    collective's bus factor, 2 (tp - 1) / tp for an all-reduce) in GB/s."""
    if not t_us > 0:
        raise ValueError(f"bandwidth needs a positive time, got {t_us} us")
    alg = bytes_moved / (t_us * 1e3)
    return {"algbw_GBps": alg, "busbw_GBps": alg * bus_factor}
