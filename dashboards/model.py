"""The results as the pages see them: rows, runs and case identities.

Reads only the Arrow rows (``jobs.results.read_results``); nothing here
knows about kernels. A *case* is what stays the same from run to run: the
regression key of ``jobs.regression`` (suite, op, variant, transport,
placement, backend, tp, hidden, tokens, top_k, hc, dtype, GPU model), so
the dashboards and the jobs judge the same series. Its id (a short hash of
those) names anchors and chart ids.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from jobs.regression import KEY as REGRESSION_KEY
from jobs.results import read_results
from jobs.results.runs import BASELINE_STATUSES, read_manifests
from jobs.results.schema import NIGHTLY

CASE_FIELDS: tuple[str, ...] = tuple(REGRESSION_KEY)
#: Baseline implementations timed beside a kernel are rows of their own whose
#: variant starts with this (jobs/profile.py).
BASELINE_PREFIX = "baseline:"
#: Environment columns shown per run, in display order.
ENV_FIELDS = ("nodes", "gpu_model", "gpu_count", "topology", "multicast_supported", "driver",
              "cuda", "torch", "cute_dsl", "ray", "pyarrow", "python", "hostname", "git_commit")
OUTCOME_ORDER = ("pass", "fail", "hang", "error", "skipped")
#: Worst first: the outcome a cell of several rows shows.
OUTCOME_SEVERITY = {"hang": 0, "error": 1, "fail": 2, "skipped": 3, "pass": 4}

Row = dict[str, Any]


def case_key(row: Row) -> tuple:
    return tuple(row.get(name) for name in CASE_FIELDS)


def case_id(row: Row) -> str:
    """A short stable id of the row's case (safe in HTML ids and URLs)."""
    text = json.dumps(case_key(row), default=str)
    return "c" + hashlib.sha1(text.encode()).hexdigest()[:10]


def case_label(row: Row) -> str:
    """The case in words, without the op: ``variant · multicast · tp=8 ...``."""
    parts = [row.get("variant") or "-"]
    for name in ("transport", "backend"):
        if row.get(name):
            parts.append(str(row[name]))
    for name in ("tp", "hidden", "tokens", "top_k", "hc"):
        if row.get(name) is not None:
            parts.append(f"{name}={row[name]}")
    if row.get("dtype"):
        parts.append(str(row["dtype"]))
    return " · ".join(parts)


def extra_of(row: Row) -> dict:
    """A row's ``extra`` JSON as a dict ({} when absent or not an object)."""
    try:
        value = json.loads(row.get("extra") or "{}")
    except (json.JSONDecodeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def rank_spread_us(row: Row) -> float | None:
    """Max minus min of a group's per-rank medians (``extra.rank_median_us``),
    None below two ranks: where it is large, the max over ranks carries the
    start skew of the replays rather than a kernel's time."""
    medians = numbers(extra_of(row).get("rank_median_us"))
    return max(medians) - min(medians) if len(medians) >= 2 else None


def number(value: Any) -> float | None:
    """``value`` when it is a finite real number (not a bool), else None:
    for what ``extra`` JSON holds, which may be anything."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def numbers(values: Any) -> list[float]:
    """The finite real numbers of ``values`` (a list from ``extra``; [] for
    anything else)."""
    if not isinstance(values, list):
        return []
    return [v for v in map(number, values) if v is not None]


TRACES_DIR = "traces"
"""Where the site keeps the traces its rows name (``extra.trace_path``)."""


def trace_file(row: Row) -> Path | None:
    """The merged trace a row names in ``extra.trace_path`` (python -m jobs
    trace), when that file exists."""
    path = extra_of(row).get("trace_path")
    return Path(path) if isinstance(path, str) and path and Path(path).is_file() else None


def trace_href(row: Row) -> str | None:
    """The row's trace in the site (the build copies it there), or None."""
    path = trace_file(row)
    return f"{TRACES_DIR}/{path.name}" if path else None


def is_baseline(row: Row) -> bool:
    return str(row.get("variant") or "").startswith(BASELINE_PREFIX)


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (an op name), unique per text."""
    clean = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:40] or "x"
    if clean != text:
        clean += "-" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:6]
    return clean


@dataclass
class Run:
    run_id: str
    trigger: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    rows: list[Row] = field(default_factory=list)
    status: str = "unrecorded"
    """The run manifest's effective status (jobs.results.runs.STATUSES):
    ``incomplete`` is a run whose driver went away before it finished."""
    accounting: list[dict] = field(default_factory=list)
    """Where the run's time went, per job section as it ended (its manifest's
    ``accounting``: job, cases, wall_s, work_s and what ``work`` is,
    overhead = wall / work, peak_groups, build_s, prepare_s, rebuilt_cases /
    rebuilt_s: :attr:`jobs.recorder.Run.accounting`); empty for a run
    without a manifest."""

    @property
    def baseline(self) -> bool:
        """Whether the run may serve as regression history."""
        return self.status in BASELINE_STATUSES

    @property
    def suites(self) -> list[str]:
        return sorted({r["suite"] for r in self.rows})

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOME_ORDER, 0)
        for r in self.rows:
            out[r["outcome"]] = out.get(r["outcome"], 0) + 1
        return out

    def env(self) -> dict[str, list[Any]]:
        """Each environment column's distinct values in this run (nulls left out)."""
        values: dict[str, list[Any]] = {}
        for name in ENV_FIELDS:
            seen: list[Any] = []
            for r in self.rows:
                v = r.get(name)
                if v is not None and v not in seen:
                    seen.append(v)
            values[name] = seen
        return values


@dataclass
class Results:
    """Every row, and the runs newest first."""
    root: Path
    rows: list[Row]
    runs: list[Run]

    @property
    def latest(self) -> Run | None:
        """The latest nightly run (an ad-hoc ``jobs trace`` or a CI run is
        not the perf team's latest); where there is none, the latest run of
        any trigger (:attr:`latest_is_nightly` says which)."""
        return next(iter(self.nightly_runs or self.runs), None)

    @property
    def latest_is_nightly(self) -> bool:
        return bool(self.nightly_runs)

    @property
    def nightly_runs(self) -> list[Run]:
        """The nightly runs, newest first."""
        return [r for r in self.runs if r.trigger == NIGHTLY]

    @property
    def other_runs(self) -> list[Run]:
        """The ad-hoc and CI runs, newest first: listed apart."""
        return [r for r in self.runs if r.trigger != NIGHTLY]

    def run(self, run_id: str) -> Run:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise KeyError(f"no run {run_id!r}; runs: {[r.run_id for r in self.runs]}")

    @property
    def ops(self) -> list[str]:
        return sorted({r["op"] for r in self.rows})

    def timed_rows(self) -> list[Row]:
        return [r for r in self.rows if r.get("t_median_us") is not None]


def load(root: str | Path) -> Results:
    """Read the dataset under ``root``; an existing root without files gives
    no rows and no runs. FileNotFoundError when ``root`` is not a directory."""
    root = Path(root)
    table = read_results(root)
    results = from_table(root, table)
    manifests = read_manifests(root)
    for run in results.runs:
        entries = (manifests.get(run.run_id) or {}).get("accounting")
        run.accounting = [_entry(e) for e in entries if isinstance(e, dict) and number(
            e.get("wall_s")) is not None] if isinstance(entries, list) else []
    return results


ACCOUNTING_NUMBERS = ("wall_s", "work_s", "overhead", "build_s", "prepare_s", "rebuilt_s",
                      "cases", "peak_groups", "rebuilt_cases")


def _entry(entry: dict) -> dict:
    """An accounting entry with each number it should hold a finite number
    or None (a manifest is JSON anyone can edit)."""
    out = dict(entry)
    for key in ACCOUNTING_NUMBERS:
        if key in out:
            out[key] = number(out[key])
    phases = out.pop("phases_s", None)
    if isinstance(phases, dict):
        out["phases_s"] = {k: v for k, v in phases.items() if number(v) is not None}
    return out


def from_table(root: Path, table: pa.Table) -> Results:
    if table.num_rows:
        table = table.sort_by([("started_at", "ascending")])
    rows = table.to_pylist()
    for index, row in enumerate(rows):
        row["_index"] = index
        row["_case"] = case_id(row)
    by_run: dict[str, Run] = {}
    for row in rows:
        run = by_run.get(row["run_id"])
        if run is None:
            run = by_run[row["run_id"]] = Run(row["run_id"], row["trigger"], row["started_at"],
                                              row["finished_at"],
                                              status=row.get("run_status") or "unrecorded")
        run.rows.append(row)
        run.started_at = min(run.started_at, row["started_at"])
        if row["finished_at"] is not None:
            run.finished_at = max(filter(None, (run.finished_at, row["finished_at"])))
    runs = sorted(by_run.values(), key=lambda r: r.started_at, reverse=True)
    return Results(root, rows, runs)


def group(rows: list[Row], *names: str) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        out[tuple(r.get(n) for n in names)].append(r)
    return out


def worst_outcome(rows: list[Row]) -> str:
    return min((r["outcome"] for r in rows), key=lambda o: OUTCOME_SEVERITY.get(o, -1))


def sort_key(value: Any) -> tuple:
    """Sort mixed/None values: None last, numbers numerically, text as text."""
    if value is None:
        return (2, 0, "")
    if isinstance(value, (int, float)):
        return (0, value, "")
    return (1, 0, str(value))
