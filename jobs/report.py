"""``python -m jobs report``: print a run from the results store, or compare two.

    python -m jobs report [--results DIR]            # the latest run
    python -m jobs report RUN_ID                     # that run
    python -m jobs report RUN_A RUN_B                # B against A
    python -m jobs report --list                     # the runs, newest first
    python -m jobs report --format csv               # the row table alone: csv, json, md

A run prints its identity (trigger, commit, backend, GPUs), counts by suite,
job and outcome, then the failing rows with their repro commands and the
timed rows (``--all``: every row). A comparison lines the two runs' cases
up by identity and prints the cases whose outcome changed and the timed
cases with their B/A ratio. A run's manifest status (finished, running,
interrupted: stopped by SIGINT or SIGTERM; incomplete: its driver went away
before it finished) is printed with it. Exit status 1 when the (last) run
has failing rows or is interrupted or incomplete, 2 when a run id is
unknown.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cluster.topology import brief
from jobs import exits
from jobs.config import ConfigError
from jobs.formats import write
from jobs.table import Col, Table, job_col, op_col

IDENTITY = ("suite", "job", "op", "variant", "transport", "placement", "backend", "tp", "hidden",
            "tokens", "top_k", "hc", "dtype", "what")
ROW_COLS = [Col("suite", 8), job_col(), op_col(), Col("variant", 18), Col("tp", 3, "d"),
            Col("hidden", 6, "d"), Col("M", 4, "d"), Col("inputs/fault", 22),
            Col("#wrong", 7, "d"), Col("median_us", 9, ".2f"), Col("p99_us", 9, ".2f"),
            Col("result", 7), Col("reason", 50)]


def _rows(results: Path, run_id: str) -> list[dict]:
    from jobs.results import read_results, row_job
    rows = read_results(results, filters={"run_id": run_id}).to_pylist()
    for r in rows:
        extra = json.loads(r.get("extra") or "{}")
        r["job"] = row_job(r) or "-"
        r["what"] = extra.get("inputs") or r.get("fault_kind") or extra.get("arch") or ""
    return sorted(rows, key=lambda r: r["started_at"])


def _resolve(results: Path, wanted: list[str]) -> list[str]:
    from jobs.results import list_runs
    if not results.is_dir():
        raise ConfigError(f"--results {results}: no results directory")
    runs = list_runs(results).column("run_id").to_pylist()
    if not runs:
        raise ConfigError(f"--results {results}: no runs recorded")
    if not wanted:
        return [runs[0]]
    out = []
    for w in wanted:
        hits = [r for r in runs if r == w] or [r for r in runs if r.startswith(w)]
        if len(hits) != 1:
            raise ConfigError(f"run {w!r}: {'ambiguous' if hits else 'unknown'}; "
                              f"latest runs: {runs[:5]}")
        out.append(hits[0])
    return out


def list_runs_table(results: Path, fmt: str = "table") -> None:
    from jobs.results import list_runs
    write(fmt, [Col("run_id", 33), Col("status", 11), Col("trigger", 8), Col("started_at", 20),
                Col("rows", 6, "d"), Col("suites", 30)],
          ([r["run_id"], r["run_status"], r["trigger"],
            f"{r['started_at']:%Y-%m-%d %H:%M:%S}", r["rows"], ",".join(sorted(r["suites"]))]
           for r in list_runs(results).to_pylist()))


def print_run(results: Path, run_id: str, *, show_all: bool = False, fmt: str = "table") -> int:
    rows = _rows(results, run_id)
    if fmt != "table":
        return _write_run(rows, show_all, fmt)
    first = rows[0]
    backends = sorted({r["backend"] for r in rows if r["backend"]})
    print(f"run {run_id}  trigger={first['trigger']}  commit={first['git_commit'] or 'unknown'}  "
          f"host={first['hostname']}  backends={','.join(backends)}")
    print(f"started {min(r['started_at'] for r in rows):%Y-%m-%d %H:%M:%S} UTC, "
          f"{len(rows)} rows; topology: {brief(first['topology'])}")
    status = first.get("run_status") or "unrecorded"
    print(f"status: {status}" + {
        "incomplete": " -- the driver went away before the run finished: these counts cover "
                      "only the cases that ended, and the run is no regression baseline",
        "interrupted": " -- stopped by SIGINT or SIGTERM after the case in hand: these counts "
                       f"cover the cases that ended; complete it with --run-id {run_id} "
                       "--resume (the same command)",
        "running": " -- the run has not finished yet"}.get(status, "") + "\n")
    counts: Counter = Counter((r["suite"], r["job"], r["outcome"]) for r in rows)
    groups = sorted({(s, j) for s, j, _ in counts})
    summary = Table([Col("suite", 10), job_col(), Col("pass", 6, "d"), Col("fail", 6, "d"),
                     Col("hang", 6, "d"), Col("error", 6, "d"), Col("skipped", 7, "d")])
    for s, j in groups:
        summary.row([s, j, *(counts[(s, j, o)] for o in ("pass", "fail", "hang", "error", "skipped"))])
    failing = [r for r in rows if r["outcome"] in ("fail", "hang", "error")]
    shown = rows if show_all else failing + [r for r in rows if r["t_median_us"] is not None
                                             and r["outcome"] not in ("fail", "hang", "error")]
    if shown:
        print()
        table = Table(ROW_COLS)
        for r in shown:
            table.row([r["suite"], r["job"], r["op"], r["variant"], r["tp"], r["hidden"],
                       r["tokens"], r["what"], r["mismatches"], r["t_median_us"], r["t_p99_us"],
                       r["outcome"], r["reason"] or ""])
    if failing:
        print(f"\n{len(failing)} failing row(s):")
        for r in failing:
            print(f"  [{r['outcome']}] {r['reason'] or ''}\n      {r['repro_command'] or '(no repro recorded)'}")
    return exits.FAILED if failing or status in ("incomplete", "interrupted") else exits.OK


def _failing(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["outcome"] in ("fail", "hang", "error")]


def _write_run(rows: list[dict], show_all: bool, fmt: str) -> int:
    """The run's row table alone in ``fmt`` (csv, json, md), with the
    commit, run id and repro command of each row; the exit status as
    :func:`print_run`'s."""
    failing = _failing(rows)
    shown = rows if show_all else failing + [r for r in rows if r["t_median_us"] is not None
                                             and r["outcome"] not in ("fail", "hang", "error")]
    cols = [Col("run_id", 0), Col("git_commit", 0), *ROW_COLS, Col("algbw_gbps", 0, ".1f"),
            Col("busbw_gbps", 0, ".1f"), Col("repro_command", 0)]
    write(fmt, cols, ([r["run_id"], r["git_commit"], r["suite"], r["job"], r["op"], r["variant"],
                       r["tp"], r["hidden"], r["tokens"], r["what"], r["mismatches"],
                       r["t_median_us"], r["t_p99_us"], r["outcome"], r["reason"],
                       r.get("algbw_gbps"), r.get("busbw_gbps"), r["repro_command"]]
                      for r in shown))
    status = rows[0].get("run_status") or "unrecorded"
    return exits.FAILED if failing or status in ("incomplete", "interrupted") else exits.OK


def compare(results: Path, run_a: str, run_b: str, fmt: str = "table") -> int:
    a = {tuple(r[k] for k in IDENTITY): r for r in _rows(results, run_a)}
    b = {tuple(r[k] for k in IDENTITY): r for r in _rows(results, run_b)}
    if fmt == "table":
        print(f"comparing B={run_b} against A={run_a}: {len(a)} / {len(b)} cases, "
              f"{len(a.keys() & b.keys())} in both\n")
    cols = [Col("suite", 8), job_col(), op_col(), Col("variant", 18), Col("tp", 3, "d"),
            Col("hidden", 6, "d"), Col("M", 4, "d"), Col("inputs/fault", 22), Col("A", 7),
            Col("B", 7), Col("A_us", 9, ".2f"), Col("B_us", 9, ".2f"), Col("B/A", 6, ".3f")]
    table = Table(cols) if fmt == "table" else None
    out = []
    changed = 0
    for key in sorted(a.keys() | b.keys(), key=lambda k: tuple(str(x) for x in k)):
        ra, rb = a.get(key), b.get(key)
        oa, ob = (ra or {}).get("outcome", "-"), (rb or {}).get("outcome", "-")
        ta, tb = (ra or {}).get("t_median_us"), (rb or {}).get("t_median_us")
        if oa == ob and (ta is None or tb is None):
            continue
        changed += oa != ob
        r = rb or ra
        row = [r["suite"], r["job"], r["op"], r["variant"], r["tp"], r["hidden"], r["tokens"],
               r["what"], oa, ob, ta, tb, tb / ta if ta and tb else None]
        table.row(row) if table is not None else out.append(row)
    if table is None:
        write(fmt, cols, out)
    elif not table._printed_header:
        print("no case changed outcome and neither run has timings in common")
    if table is not None:
        print(f"\n{changed} case(s) changed outcome")
    return exits.FAILED if any(r["outcome"] in ("fail", "hang", "error") for r in b.values()) else exits.OK


def main(args) -> int:
    results = Path(args.results)
    if args.list:
        if not results.is_dir():
            raise ConfigError(f"--results {results}: no results directory")
        list_runs_table(results, args.format)
        return exits.OK
    if len(args.runs) > 2:
        raise ConfigError(f"report takes at most two run ids, got {len(args.runs)}: {args.runs}")
    runs = _resolve(results, args.runs)
    if len(runs) == 2:
        return compare(results, *runs, fmt=args.format)
    return print_run(results, runs[0], show_all=args.all, fmt=args.format)
