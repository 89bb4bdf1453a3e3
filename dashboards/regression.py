"""Regression verdicts for every timed row, with the jobs' own rule.

The rule and its defaults live in ``jobs.regression`` (Conbench's: beyond 5
stdev of the last 10 nightly results AND more than 5 % worse; fewer than 5
earlier nightly results is ``insufficient-history``, its own status; the
mirror image is ``improved``). This module only picks each row's history
from the rows the site has and calls ``jobs.regression.judge`` on it, so the
pages and the nightly job never disagree about the rule.

History of a row = per earlier nightly run, the median ``t_median_us`` of
the same case (``model.case_id``, i.e. ``jobs.regression.KEY``) among its
passing rows; the last ``rule.history`` such runs. A row without a latency
is ``no-timing``. One difference from ``jobs.regression.detect``: that one
only takes rows of the profile job (``extra.job == "profile"``); here any
passing row with a ``t_median_us`` counts (today only the profile job
writes one).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from jobs.regression import Rule, judge
from jobs.timings import is_timing

from dashboards.model import Results

STATUSES = ("regressed", "improved", "ok", "insufficient-history", "no-timing")
DEFAULT_RULE = Rule()


@dataclass(frozen=True)
class Verdict:
    status: str
    value: float | None = None
    mean: float | None = None
    stdev: float | None = None
    history: int = 0
    #: the latency above which the case is flagged (None without enough history)
    threshold: float | None = None


def verdict(value: float | None, history: list[float], rule: Rule = DEFAULT_RULE) -> Verdict:
    """Judge one latency against its per-run history (oldest first; only the
    last ``rule.history`` values count) with ``jobs.regression.judge``.
    A latency that is no timing (:func:`jobs.timings.is_timing`: NaN, inf,
    zero, beyond any kernel's) is ``no-timing``: there is nothing to judge;
    such history values are left out (``_nightly_medians`` already drops
    them)."""
    if not is_timing(value):
        return Verdict("no-timing", value)
    v = judge((), value, [m for m in history if is_timing(m)][-rule.history:], (), rule)
    threshold = None
    if v.mean_us is not None:
        threshold = max(v.mean_us + rule.sigmas * v.stdev_us, v.mean_us * (1 + rule.threshold))
    return Verdict(v.status, value, v.mean_us, v.stdev_us, v.n, threshold)


def _nightly_medians(results: Results) -> dict[str, list[tuple]]:
    """Per case id: (run start, run id, median latency) of each nightly run
    with passing timed rows of it, oldest first; runs that did not finish
    (``incomplete``, still ``running``) are no history."""
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    clean = {run.run_id for run in results.runs if run.baseline}
    for row in results.rows:
        if row["trigger"] == "nightly" and row["outcome"] == "pass" and row["run_id"] in clean \
                and is_timing(row.get("t_median_us")):
            samples[row["_case"]][row["run_id"]].append(row["t_median_us"])
    starts = {run.run_id: run.started_at for run in results.runs}
    return {cid: sorted((starts[rid], rid, statistics.median(v)) for rid, v in per_run.items())
            for cid, per_run in samples.items()}


def judge_all(results: Results, rule: Rule = DEFAULT_RULE) -> dict[int, Verdict]:
    """A verdict for every row of the dataset, by the row's ``_index``."""
    medians = _nightly_medians(results)
    starts = {run.run_id: run.started_at for run in results.runs}
    out = {}
    for row in results.rows:
        begun = starts[row["run_id"]]
        history = [m for start, rid, m in medians.get(row["_case"], ())
                   if start < begun and rid != row["run_id"]]
        out[row["_index"]] = verdict(row.get("t_median_us"), history, rule)
    return out


@dataclass(frozen=True)
class CaseSegments:
    """A case's nightly history split by :mod:`jobs.changepoints`: ``nights``
    (run start, run id, median latency), oldest first, and its
    ``segmentation`` (segment and step indices are into ``nights``);
    ``status`` is the newest night's change-point status."""
    nights: list[tuple]
    segmentation: object
    status: str


def segments_all(results: Results, method=None) -> dict[str, CaseSegments] | None:
    """Per case id, its history's segments (the nightly runs that finished,
    as the lookback rule's history); None where ruptures is not installed."""
    from jobs import changepoints
    if changepoints.missing():
        return None
    method = method or changepoints.Method(min_history=DEFAULT_RULE.min_history,
                                           history=DEFAULT_RULE.history)
    out = {}
    for cid, nights in _nightly_medians(results).items():
        values = [m for _, _, m in nights]
        out[cid] = CaseSegments(nights, changepoints.segment(values, method),
                                changepoints.status(values, method)[0])
    return out


__all__ = ["DEFAULT_RULE", "CaseSegments", "Rule", "STATUSES", "Verdict", "judge_all",
           "segments_all", "verdict"]
