"""Stragglers: who starts publishing last in a TP group's calls, and by how
much, from the mark each rank already takes as its publish starts.

A rank backend times its call's publish from ``time.monotonic_ns()`` read
just before it (``publish_ns`` is measured from it, :mod:`cluster.backend`);
it also returns that reading as ``publish_start_ns``. The clock is the
system-wide CLOCK_MONOTONIC, one per host, and a TP group is pinned to one
node (:mod:`cluster.fanout`), so the marks of a group's ranks compare
directly. Per call, a rank's *offset* is its mark minus the earliest rank's
(0 for the first), and the call's *skew* is the largest offset; the *last*
rank is the one with the largest offset. :func:`summarize` turns a case's
calls into the results columns (``publish_skew_us``,
``publish_skew_max_us``, ``last_rank``, ``last_rank_share``,
``publish_offsets_us``); the dashboard's stragglers page reads the calls
themselves (``extra.publish_offsets_us_by_call``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence


def call_offsets(results: Sequence[dict | None]) -> list[float | None] | None:
    """One call's per-rank publish-start offsets from the group's first, us
    (None for a rank without a mark); None when fewer than two ranks have
    one (nothing to compare)."""
    starts = [None if r is None else r.get("publish_start_ns") for r in results]
    known = [s for s in starts if s is not None]
    if len(known) < 2:
        return None
    first = min(known)
    return [None if s is None else round((s - first) / 1e3, 3) for s in starts]


def last_rank(offsets: Sequence[float | None]) -> int:
    """The rank that started publishing last (the lowest of a tie)."""
    known = [(o, r) for r, o in enumerate(offsets) if o is not None]
    latest = max(o for o, _ in known)
    return min(r for o, r in known if o == latest)


def skew(offsets: Sequence[float | None]) -> float:
    return max(o for o in offsets if o is not None)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(calls: Iterable[Sequence[float | None] | None]) -> dict:
    """The results columns of a case's calls (their offsets, one list per
    call; None entries left out); {} when no call has two marks."""
    calls = [c for c in calls if c is not None]
    if not calls:
        return {}
    tp = max(len(c) for c in calls)
    skews = [skew(c) for c in calls]
    lasts = Counter(last_rank(c) for c in calls)
    rank, times = min(lasts.items(), key=lambda kv: (-kv[1], kv[0]))
    per_rank = []
    for r in range(tp):
        mine = [c[r] for c in calls if r < len(c) and c[r] is not None]
        per_rank.append(round(statistics.median(mine), 3) if mine else None)
    return {"publish_skew_us": round(statistics.median(skews), 3),
            "publish_skew_max_us": round(max(skews), 3),
            "last_rank": rank, "last_rank_share": round(times / len(calls), 4),
            "publish_offsets_us": per_rank}


def per_rank(calls: Sequence[Sequence[float | None]]) -> list[dict]:
    """Per rank over ``calls``: median, p90 and max offset (us), and how
    often it was last (count, share)."""
    calls = [c for c in calls if c is not None]
    tp = max((len(c) for c in calls), default=0)
    lasts = Counter(last_rank(c) for c in calls)
    out = []
    for r in range(tp):
        mine = [c[r] for c in calls if r < len(c) and c[r] is not None]
        out.append({"rank": r, "calls": len(mine),
                    "median_us": statistics.median(mine) if mine else None,
                    "p90_us": percentile(mine, 0.9) if mine else None,
                    "max_us": max(mine) if mine else None,
                    "last": lasts.get(r, 0),
                    "last_share": lasts.get(r, 0) / len(calls) if calls else None})
    return out
