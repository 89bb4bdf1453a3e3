"""Change points in a case's nightly history (beside the lookback rule of
:mod:`jobs.regression`).

A case's history is its per-night median ``t_median_us``, oldest first
(:func:`histories`). :func:`segment` splits it into segments of constant
level and reports the steps between them:

1. the series is taken in logs (a step is a ratio, whatever the kernel's
   size) and its noise ``sigma`` estimated robustly from the night-to-night
   differences (the median absolute difference, scaled to a standard
   deviation and divided by sqrt 2: a step or a spike moves one or two
   differences, not their median), floored at :data:`NOISE_FLOOR`;
2. ruptures' PELT (least squares, ``min_size = min_segment``) places the
   change points, with a penalty proportional to ``sigma**2 * log n`` (BIC);
3. each change point is tested: the step (ratio of the two segments' log
   means) must be significant (a t-test of the two means against the
   within-segment standard deviation pooled over every segment, floored at
   :data:`NOISE_FLOOR`: ``p < alpha``; its confidence is ``1 - p``), at least
   ``min_step`` in size,
   and confirmed: each of the first ``confirm`` nights after it nearer the
   new level than the old (the PyTorch HUD's "two consecutive points past
   the threshold"). A one-night jump that returns the next night fails the
   confirmation (and ``min_segment`` >= 2 keeps it from being a segment of
   its own), so it is never a step. Change points that fail are removed and
   their segments merged, until every one left passes; a last change point
   with fewer than ``confirm`` nights after it is ``pending``.

The status of the newest night (:func:`status`) is ``regressed`` /
``improved`` when the newest segment began with a confirmed step at most
``history`` nights ago, ``insufficient-history`` with fewer than
``min_history`` nights before it, ``ok`` otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

DEFAULT_MIN_SEGMENT = 2
DEFAULT_CONFIRM = 2
DEFAULT_ALPHA = 1e-3
DEFAULT_MIN_STEP = 0.025
"""2.5 %: at 2 % the H100's recorded noise gave 1.2 false regressions per
1,000 injected A/A case-nights; at 2.5 % none in 18,000 (three seeds), with
a 3 % step still caught within 3 nights with p >= 0.9
(docs/results/detection_power_h100_2026-12-07.md)."""
DEFAULT_PENALTY = 3.0
NOISE_FLOOR = 0.001
"""Relative noise below which a history's spread is not believed (0.1 %:
the timer's and the clock's resolution on a 2 us kernel)."""


@dataclasses.dataclass(frozen=True)
class Method:
    min_segment: int = DEFAULT_MIN_SEGMENT
    confirm: int = DEFAULT_CONFIRM
    alpha: float = DEFAULT_ALPHA
    min_step: float = DEFAULT_MIN_STEP
    penalty: float = DEFAULT_PENALTY
    min_history: int = 5
    history: int = 10

    def validate(self) -> None:
        from jobs.config import ConfigError
        from jobs.limits import LIMITS
        for flag, name, value in (("--min-segment", "segment", self.min_segment),
                                  ("--confirm", "segment", self.confirm),
                                  ("--alpha", "alpha", self.alpha),
                                  ("--min-step", "threshold", self.min_step)):
            try:
                LIMITS[name].check(value)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{flag} {value!r}: {err}") from None

    def describe(self) -> str:
        return (f"change points (ruptures PELT, min segment {self.min_segment} nights): a step "
                f">= {self.min_step:.0%} with p < {self.alpha:g} against the history's noise, "
                f"confirmed by {self.confirm} consecutive nights")


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int          # index of its first night
    end: int            # one past its last night
    mean_us: float      # geometric mean of its nights


@dataclasses.dataclass(frozen=True)
class Step:
    index: int          # first night of the new level
    before_us: float
    after_us: float
    change: float       # after / before - 1
    z: float
    confidence: float   # 1 - p of the z-test
    confirmed: bool     # False: pending (fewer than ``confirm`` nights after it)

    @property
    def direction(self) -> str:
        return "regressed" if self.change > 0 else "improved"


@dataclasses.dataclass(frozen=True)
class Segmentation:
    segments: tuple[Segment, ...]
    steps: tuple[Step, ...]
    sigma: float        # relative noise (of the log values)


def missing() -> str | None:
    """Why change points cannot be computed here (ruptures not installed),
    or None. Looked up, not imported: the import (scipy's statistics with
    it) costs seconds of CPU, paid only where a series is long enough to
    split (:func:`_pelt`)."""
    if importlib.util.find_spec("ruptures") is None:
        return "ruptures is not installed; pip install 'ruptures>=1.1.10'"
    return None


def noise(logs: Sequence[float]) -> float:
    """Robust noise of a log series (see the module docstring)."""
    if len(logs) < 3:
        return NOISE_FLOOR
    diffs = [abs(b - a) for a, b in zip(logs, logs[1:])]
    return max(NOISE_FLOOR, 1.4826 * statistics.median(diffs) / math.sqrt(2))


def _pelt(logs: list[float], sigma: float, method: Method) -> list[int]:
    """Change points (index of each new segment's first night) by ruptures."""
    import numpy as np
    import ruptures
    n = len(logs)
    if n < 2 * method.min_segment:
        return []
    signal = np.asarray(logs, dtype=float).reshape(-1, 1)
    algo = ruptures.Pelt(model="l2", min_size=method.min_segment, jump=1).fit(signal)
    ends = algo.predict(pen=method.penalty * sigma * sigma * math.log(n))
    return [e for e in ends if e < n]


def _pooled(logs: list[float], bounds: list[int]) -> tuple[float, int]:
    """The within-segment standard deviation (floored at :data:`NOISE_FLOOR`)
    and its degrees of freedom."""
    ss = 0.0
    for lo, hi in zip(bounds, bounds[1:]):
        m = statistics.fmean(logs[lo:hi])
        ss += sum((x - m) ** 2 for x in logs[lo:hi])
    df = len(logs) - (len(bounds) - 1)
    return (max(NOISE_FLOOR, math.sqrt(ss / df)) if df > 0 else NOISE_FLOOR), max(df, 1)


def _test(logs: list[float], lo: int, cp: int, hi: int, sigma: float, df: int,
          method: Method) -> tuple[Step, bool]:
    """The step at ``cp`` between segments [lo, cp) and [cp, hi) and
    whether it stands (significant, large enough, confirmed or pending)."""
    from scipy.stats import t as student
    a, b = logs[lo:cp], logs[cp:hi]
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    d = mb - ma
    z = d / (sigma * math.sqrt(1 / len(a) + 1 / len(b)))
    p = float(2 * student.sf(abs(z), df))
    change = math.exp(d) - 1
    first = b[:method.confirm]
    nearer = all((x - ma) * math.copysign(1, d) > abs(d) / 2 for x in first)
    confirmed = len(b) >= method.confirm and nearer
    pending = len(b) < method.confirm and nearer and hi == len(logs)
    stands = p < method.alpha and abs(change) >= method.min_step and (confirmed or pending)
    return Step(cp, math.exp(ma), math.exp(mb), change, z, 1 - p, confirmed), stands


def segment(values: Sequence[float], method: Method = Method()) -> Segmentation:
    """Segments and steps of one case's history (``values`` in us, oldest
    first; every value > 0)."""
    logs = [math.log(v) for v in values]
    n = len(logs)
    if n == 0:
        return Segmentation((), (), NOISE_FLOOR)
    sigma = noise(logs)
    cps = _pelt(logs, sigma, method)
    while True:
        bounds = [0, *cps, n]
        pooled, df = _pooled(logs, bounds)
        tested = [_test(logs, bounds[i], bounds[i + 1], bounds[i + 2], pooled, df, method)
                  for i in range(len(cps))]
        weakest = [i for i, (step, stands) in enumerate(tested) if not stands]
        if not weakest:
            break
        # drop the least significant failing change point, then test again
        drop = min(weakest, key=lambda i: abs(tested[i][0].z))
        cps = cps[:drop] + cps[drop + 1:]
    bounds = [0, *cps, n]
    segments = tuple(Segment(lo, hi, math.exp(statistics.fmean(logs[lo:hi])))
                     for lo, hi in zip(bounds, bounds[1:]))
    return Segmentation(segments, tuple(step for step, _ in tested), pooled)


def status(values: Sequence[float], method: Method = Method()) -> tuple[str, Step | None]:
    """The newest night's status by change points (module docstring) and the
    step that decides it."""
    if len(values) - 1 < method.min_history:
        return "insufficient-history", None
    seg = segment(values, method)
    last = seg.steps[-1] if seg.steps else None
    if last is not None and last.confirmed and len(values) - last.index <= method.history:
        return last.direction, last
    return "ok", None


# ------------------------------------------------------------ the store's side
@dataclasses.dataclass(frozen=True)
class Night:
    run_id: str
    started_at: object
    git_commit: str | None
    median_us: float


@dataclasses.dataclass(frozen=True)
class History:
    key: tuple                      # jobs.timings.KEY values
    nights: tuple[Night, ...]
    case_key: str | None            # extra.case_key: what ``jobs bisect --case`` takes

    @property
    def case(self) -> dict:
        from jobs.timings import KEY
        return dict(zip(KEY, self.key))

    @property
    def values(self) -> list[float]:
        return [n.median_us for n in self.nights]


def histories(results: str | Path, *, until: str | None = None) -> list[History]:
    """Every timed case's nightly history in ``results`` (finished nightly
    runs, oldest first; with ``until``, up to and including that run)."""
    from jobs.timings import KEY, METRIC, timed_rows
    from jobs.results import read_results
    from jobs.results.runs import BASELINE_STATUSES
    import json
    rows = timed_rows(read_results(results))
    if until is not None:
        mine = [r["started_at"] for r in rows if r["run_id"] == until]
        if not mine:
            return []
        cutoff = min(mine)
        rows = [r for r in rows if r["started_at"] <= cutoff or r["run_id"] == until]
    per: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    keys: dict[tuple, str] = {}
    for r in rows:
        ck = json.loads(r.get("extra") or "{}").get("case_key")
        if ck:
            keys[(r["suite"], r["op"], ck.split("|")[2], r["tp"], r["hidden"], r["tokens"])] = ck
        if r["trigger"] == "nightly" and (r["run_id"] == until or
                                          r.get("run_status", "unrecorded") in BASELINE_STATUSES):
            per[tuple(r[k] for k in KEY)][r["run_id"]].append(r)
    out = []
    for key, runs in per.items():
        nights = sorted((Night(rid, min(x["started_at"] for x in rs), rs[0].get("git_commit"),
                               statistics.median(x[METRIC] for x in rs))
                         for rid, rs in runs.items()), key=lambda n: n.started_at)
        c = dict(zip(KEY, key))
        out.append(History(key, tuple(nights), keys.get((c["suite"], c["op"], c["variant"],
                                                         c["tp"], c["hidden"], c["tokens"]))))
    return sorted(out, key=lambda h: tuple(str(x) for x in h.key))


def bisect_command(h: History, step: Step, results: str | Path) -> str | None:
    """The ``jobs bisect`` command that narrows ``step``'s commit range; None
    where it cannot (a baseline, no case key, a commit unknown or the same
    on both sides)."""
    before, after = h.nights[step.index - 1], h.nights[step.index]
    if h.case_key is None or str(h.case.get("variant") or "").startswith("baseline:") or \
            not before.git_commit or not after.git_commit or \
            before.git_commit == after.git_commit:
        return None
    return (f"python -m jobs bisect --case '{h.case_key}' --good {before.git_commit[:12]} "
            f"--bad {after.git_commit[:12]} --suite {h.case['suite']} --kind latency "
            f"--results {results}")
