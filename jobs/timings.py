"""What both regression rules judge (:mod:`jobs.regression`'s lookback and
:mod:`jobs.changepoints`): the identity of a timed case and which rows carry
a timing. A leaf, so the two rules import it and not each other."""

from __future__ import annotations

from jobs.results.schema import row_job

KEY = ("suite", "op", "variant", "transport", "placement", "backend", "tp", "hidden", "tokens",
       "top_k", "hc", "dtype", "gpu_model")
"""A timed case's identity (emulated and GPU figures, and GPU models, never mix)."""
METRIC = "t_median_us"


MAX_TIMING_US = 1e9
"""No kernel call takes 1,000 s: a median beyond it is a broken measurement."""


def is_timing(t: float | None) -> bool:
    """``t`` (microseconds) is a timing the rule can judge: a number in
    (0, :data:`MAX_TIMING_US`]. A NaN, an infinity, a zero or a huge value
    is none, and would poison a history's mean and stdev (``fsum``
    overflows past 1e308)."""
    return t is not None and 0 < t <= MAX_TIMING_US


def timed_rows(table) -> list[dict]:
    """Rows of the profile job that carry a passing timing (:func:`is_timing`)."""
    out = []
    for row in table.to_pylist():
        if row.get("outcome") != "pass" or not is_timing(row.get(METRIC)):
            continue
        if row_job(row) == "profile":
            out.append(row)
    return out
