"""Regression detection against the history in the Arrow store (Conbench's rule).

Per case, the history is the last ``history`` nightly runs (``trigger =
nightly``) before the run under test that have a passing timing for it.
The case is

- ``regressed`` when its median is beyond ``sigmas`` standard deviations
  of the history AND more than ``threshold`` worse than the history mean
  (defaults: 10 runs, 5 sigma, 5 %);
- ``insufficient-history`` when fewer than ``min_history`` runs (default 5)
  have it: its own status, never read as "no regression";
- ``ok`` otherwise (``improved`` when the same two tests hold the other way).

A case is the results' case identity: suite, op, variant, transport,
placement, backend, tp, hidden, tokens, top_k, hc, dtype and the GPU model
(emulated and GPU figures never mix). Timed rows are those of the profile
job (``job == "profile"``) with outcome pass and a ``t_median_us``;
baselines (``variant`` ``baseline:*``) are compared too but only reported,
never failing the run: they measure torch, not our kernels.

Correctness failures and hangs are not a statistical question: any failing
row (fail, hang, error) fails the run on its own (the jobs count them).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from pathlib import Path

from jobs.timings import KEY, MAX_TIMING_US, METRIC, is_timing, timed_rows  # noqa: F401 (re-exported)


DEFAULT_HISTORY = 10
DEFAULT_MIN_HISTORY = 5
DEFAULT_SIGMAS = 5.0
DEFAULT_THRESHOLD = 0.05


@dataclasses.dataclass(frozen=True)
class Rule:
    history: int = DEFAULT_HISTORY
    min_history: int = DEFAULT_MIN_HISTORY
    sigmas: float = DEFAULT_SIGMAS
    threshold: float = DEFAULT_THRESHOLD

    def validate(self) -> None:
        from jobs.config import ConfigError
        from jobs.limits import LIMITS
        for flag, name, value in (("--history", "history", self.history),
                                  ("--min-history", "history", self.min_history),
                                  ("--sigmas", "sigmas", self.sigmas),
                                  ("--threshold", "threshold", self.threshold)):
            try:
                LIMITS[name].check(value)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{flag} {value!r}: {err}") from None
        if self.history < 1 or not 1 <= self.min_history <= self.history:
            raise ConfigError(f"--history {self.history} / --min-history {self.min_history}: "
                              f"need 1 <= min-history <= history")
        if not self.sigmas > 0 or not self.threshold >= 0:
            raise ConfigError(f"--sigmas {self.sigmas} must be > 0 and --threshold "
                              f"{self.threshold} >= 0")

    def describe(self) -> str:
        return (f"regressed when > {self.sigmas:g} stdev and > {self.threshold:.0%} worse than "
                f"the mean of the last {self.history} nightly runs (at least {self.min_history})")


@dataclasses.dataclass(frozen=True)
class Verdict:
    key: tuple
    status: str          # regressed | improved | ok | insufficient-history
    current_us: float
    mean_us: float | None
    stdev_us: float | None
    n: int
    change: float | None  # current / mean - 1
    z: float | None
    history_runs: tuple[str, ...]
    #: the change-point method's status of this night (jobs.changepoints.status;
    #: None where it was not asked for) and the step that decides it
    cp_status: str | None = None
    cp_step: object | None = None

    @property
    def case(self) -> dict:
        return dict(zip(KEY, self.key))

    @property
    def is_baseline(self) -> bool:
        return str(self.case["variant"] or "").startswith("baseline:")

    def describe(self) -> str:
        if self.status == "insufficient-history":
            return f"insufficient history: {self.n} earlier nightly run(s) have this case"
        return (f"{self.current_us:.2f} us vs mean {self.mean_us:.2f} us (stdev {self.stdev_us:.3f}) "
                f"over {self.n} nightly runs: {self.change:+.1%}"
                + ("" if self.z is None or math.isinf(self.z) else f", {self.z:+.1f} sigma"))


def detect(results: str | Path, run_id: str, rule: Rule = Rule(),
           method=None) -> list[Verdict]:
    """Verdicts for every timed case of run ``run_id`` under ``results``;
    history is earlier nightly runs that finished (never an incomplete one).
    With ``method`` (a :class:`jobs.changepoints.Method`) each verdict also
    carries the change-point status of this night against the case's whole
    nightly history."""
    from jobs.results import read_results
    from jobs.results.runs import BASELINE_STATUSES
    table = read_results(results)
    rows = timed_rows(table)
    current = [r for r in rows if r["run_id"] == run_id]
    if not current:
        return []
    started = min(r["started_at"] for r in current)
    by_case: dict[tuple, dict[str, list[tuple]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["run_id"] != run_id and r["trigger"] == "nightly" and r["started_at"] < started \
                and r.get("run_status", "unrecorded") in BASELINE_STATUSES:
            by_case[tuple(r[k] for k in KEY)][r["run_id"]].append((r["started_at"], r[METRIC]))
    verdicts = []
    for key, values in _per_case(current).items():
        every = sorted(by_case.get(key, {}).items(), key=lambda kv: min(t for t, _ in kv[1]))
        runs = every[-rule.history:]
        history = [statistics.median(v for _, v in samples) for _, samples in runs]
        v = judge(key, values, history, tuple(r for r, _ in runs), rule)
        if method is not None:
            from jobs import changepoints
            whole = [statistics.median(x for _, x in samples) for _, samples in every]
            cp, step = changepoints.status([*whole, values], method)
            v = dataclasses.replace(v, cp_status=cp, cp_step=step)
        verdicts.append(v)
    return verdicts


def _per_case(rows: list[dict]) -> dict[tuple, float]:
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        grouped[tuple(r[k] for k in KEY)].append(r[METRIC])
    return {k: statistics.median(v) for k, v in grouped.items()}


MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a normal sample, scaled to its stdev


def judge(key: tuple, current: float, history: list[float], runs: tuple[str, ...],
          rule: Rule, *, robust: bool = False) -> Verdict:
    """The rule on one case (see the module docstring).

    ``robust``: the history's centre is its median and its spread the
    median absolute deviation scaled to a standard deviation
    (:data:`MAD_TO_SIGMA`), in place of mean and stdev; the verdict's
    ``mean_us`` / ``stdev_us`` then hold those two. For a handful of values
    measured beside the candidate (a bisect step: five good runs), where
    one disturbed run would widen the stdev enough to let a fivefold
    slowdown through. A spread of zero (identical values) falls back to the
    stdev, itself zero then, and the threshold alone decides."""
    n = len(history)
    if n < rule.min_history:
        return Verdict(key, "insufficient-history", current, None, None, n, None, None, runs)
    if robust:
        mean = statistics.median(history)
        stdev = MAD_TO_SIGMA * statistics.median(abs(x - mean) for x in history)
        if stdev == 0 and n > 1:
            stdev = statistics.stdev(history)
    else:
        mean = statistics.fmean(history)
        stdev = statistics.stdev(history) if n > 1 else 0.0
    change = current / mean - 1 if mean else math.inf
    diff = current - mean
    z = diff / stdev if stdev > 0 else (math.inf if diff > 0 else -math.inf if diff < 0 else 0.0)
    if diff > rule.sigmas * stdev and change > rule.threshold:
        status = "regressed"
    elif -diff > rule.sigmas * stdev and -change > rule.threshold:
        status = "improved"
    else:
        status = "ok"
    return Verdict(key, status, current, mean, stdev, n, change, z, runs)



def repro(v: Verdict) -> str:
    c = v.case
    return (f"python -m jobs profile --suite {c['suite']} --backend {c['backend']} "
            f"--ops {c['op']} --tp {c['tp']} --hidden {c['hidden']} --tokens {c['tokens']} "
            f"--variant {c['variant']} --transport {c['transport']}")


STATUSES = ("regressed", "improved", "ok", "insufficient-history")


def flagged(v: Verdict) -> str:
    """The verdict's status by either rule: regressed (by either) before
    improved before the lookback rule's own status."""
    both = (v.status, v.cp_status)
    return next((s for s in ("regressed", "improved") if s in both), v.status)


def show(verdicts: list[Verdict], rule: Rule, *, method=None, fmt: str = "table",
         only: tuple[str, ...] | None = None) -> int:
    """Print the verdicts as a table (``fmt``: :mod:`jobs.formats`), the
    regressed kernel cases with the command that re-measures them; returns
    how many kernel cases the lookback rule found regressed. With ``method``
    the change-point verdicts are shown beside it and the cases only they
    find regressed are listed, but they do not count: the change-point
    method reports without failing a run until its false-alarm rate on real
    GPU noise is on record (docs/design.md, "Change points"). ``only``: the
    rows whose status by either rule is one of these.

    Verdicts are printed, not written: the rows they judge are in the store
    already, and ``dashboards`` applies the same rule to them (writing
    verdict rows would count every timed case twice)."""
    import sys
    from jobs import formats
    from jobs.table import Col, op_col
    say = print if fmt == "table" else (lambda *a: print(*a, file=sys.stderr))
    say(f"\n== regression: {len(verdicts)} timed case(s); {rule.describe()}"
        + (f"; and {method.describe()}" if method is not None else "") + " ==")
    cols = [Col("suite", 8), op_col(), Col("variant", 18), Col("tp", 3, "d"),
            Col("hidden", 6, "d"), Col("M", 4, "d"), Col("now_us", 9, ".2f"),
            Col("mean_us", 9, ".2f"), Col("stdev_us", 8, ".3f"), Col("n", 3, "d"),
            Col("change", 7, "+.1%"), Col("status", 20)]
    if method is not None:
        cols += [Col("cp_status", 20), Col("cp_step", 7, "+.1%"), Col("cp_conf", 7, ".4f")]
    regressed, stepped, rows = [], [], []
    for v in sorted(verdicts, key=lambda v: tuple(str(x) for x in v.key)):
        c = v.case
        if not v.is_baseline:
            if v.status == "regressed":
                regressed.append(v)
            elif flagged(v) == "regressed":
                stepped.append(v)
        if only is not None and v.status not in only and v.cp_status not in only:
            continue
        row = [c["suite"], c["op"], c["variant"], c["tp"], c["hidden"], c["tokens"],
               v.current_us, v.mean_us, v.stdev_us, v.n, v.change,
               v.status + (" (baseline)" if v.is_baseline and v.status == "regressed" else "")]
        if method is not None:
            step = v.cp_step
            row += [v.cp_status + (" (baseline)" if v.is_baseline and v.cp_status == "regressed"
                                   else ""),
                    step.change if step else None, step.confidence if step else None]
        rows.append(row)
    formats.write(fmt, cols, rows)
    for v in regressed:
        say(f"  [regressed] {v.case['op']} tp={v.case['tp']} hidden={v.case['hidden']} "
            f"M={v.case['tokens']} {v.case['variant']}: {v.describe()}"
            + (f"; change points: {v.cp_status} {v.cp_step.change:+.1%} "
               f"(confidence {v.cp_step.confidence:.4f})" if v.cp_step is not None else "")
            + f"\n      {repro(v)}")
    for v in stepped:
        say(f"  [step, reported only] {v.case['op']} tp={v.case['tp']} "
            f"hidden={v.case['hidden']} M={v.case['tokens']} {v.case['variant']}: change points "
            f"{v.cp_step.change:+.1%} (confidence {v.cp_step.confidence:.4f}); the lookback "
            f"rule: {v.status}\n      {repro(v)}")
    return len(regressed)


def show_segments(results: str | Path, run_id: str | None, method, *, fmt: str = "table",
                  only: tuple[str, ...] | None = None) -> int:
    """Every timed case's nightly history (up to ``run_id``) split into
    segments by :mod:`jobs.changepoints`: one row per segment with the step
    into it (size, confidence, the commit range: the last night before and
    the first after) and the ``jobs bisect`` command that narrows that
    range. ``only``: the cases whose newest night's change-point status is
    one of these. Returns how many confirmed regressed steps were shown."""
    import sys
    from jobs import changepoints, formats
    from jobs.table import Col, op_col
    say = print if fmt == "table" else (lambda *a: print(*a, file=sys.stderr))
    hist = changepoints.histories(results, until=run_id)
    say(f"\n== change points: {len(hist)} timed case(s) over their nightly history; "
        f"{method.describe()} ==")
    cols = [Col("suite", 8), op_col(), Col("variant", 18), Col("tp", 3, "d"),
            Col("hidden", 6, "d"), Col("M", 4, "d"), Col("seg", 3, "d"), Col("from", 16),
            Col("nights", 6, "d"), Col("mean_us", 9, ".3f"), Col("step", 7, "+.1%"),
            Col("confidence", 10, ".4f"), Col("step_status", 11), Col("good", 12),
            Col("bad", 12), Col("now", 20)]
    if fmt != "table":
        cols.append(Col("bisect", 0))
    rows, commands, regressed = [], [], 0
    for h in hist:
        values = h.values
        now, _ = changepoints.status(values, method)
        if only is not None and now not in only:
            continue
        seg = changepoints.segment(values, method)
        steps = {s.index: s for s in seg.steps}
        c = h.case
        for i, sg in enumerate(seg.segments):
            step = steps.get(sg.start)
            good = bad = cmd = None
            if step is not None:
                good = (h.nights[sg.start - 1].git_commit or "")[:12] or None
                bad = (h.nights[sg.start].git_commit or "")[:12] or None
                cmd = changepoints.bisect_command(h, step, results)
                regressed += step.confirmed and step.direction == "regressed"
                if cmd:
                    commands.append(f"  {c['op']} tp={c['tp']} hidden={c['hidden']} "
                                    f"M={c['tokens']} {c['variant']}: {step.change:+.1%} "
                                    f"at segment {i}\n      {cmd}")
            row = [c["suite"], c["op"], c["variant"], c["tp"], c["hidden"], c["tokens"], i,
                   f"{h.nights[sg.start].started_at:%Y-%m-%d %H:%M}", sg.end - sg.start,
                   sg.mean_us, step.change if step else None,
                   step.confidence if step else None,
                   (("confirmed" if step.confirmed else "pending") if step else None),
                   good, bad, now if i == len(seg.segments) - 1 else None]
            if fmt != "table":
                row.append(cmd)
            rows.append(row)
    formats.write(fmt, cols, rows)
    if commands:
        say("\ncommands that narrow each step's commit range:\n" + "\n".join(commands))
    return regressed
