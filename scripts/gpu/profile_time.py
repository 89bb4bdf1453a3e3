"""Where a profile run's time went, from its rows: per (op, tp, placement),
the cases, their summed wall time (first row's start to last row's end), the
timed CUDA-graph replays (per replay the slowest rank: median x replays x
calls per graph, summed over implementations) and the build time (compile,
load and first call: ``extra.compile_s``, max over ranks).

    python3 scripts/gpu/profile_time.py RESULTS [--run RUN_ID] [--since ISO] [--until ISO]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def case_times(rows: list[dict]) -> dict[tuple, list[float]]:
    """(op, tp, placement) -> [cases, wall s, timed s, build s] over the timed
    profile rows (a case: the rows sharing op, tp, placement, hidden, tokens
    and start time)."""
    cases: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("job") != "profile" or not r.get("t_n"):
            continue
        key = (r["op"], r["tp"], r["placement"], r["hidden"], r["tokens"], r["started_at"])
        cases[key].append(r)
    out: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for key, rs in cases.items():
        total = out[key[:3]]
        total[0] += 1
        total[1] += (max(r["finished_at"] for r in rs) - key[-1]).total_seconds()
        for r in rs:
            extra = json.loads(r.get("extra") or "{}")
            total[2] += r["t_median_us"] * 1e-6 * r["t_n"] * extra.get("calls_per_graph", 0)
            total[3] += extra.get("compile_s", 0.0)
    return dict(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/profile_time.py")
    p.add_argument("results")
    p.add_argument("--run", default=None, help="run id (default: every run)")
    p.add_argument("--since", default=None, help="rows started at or after (ISO, UTC)")
    p.add_argument("--until", default=None, help="rows started before (ISO, UTC)")
    args = p.parse_args(argv)
    from jobs.results import read_results
    rows = read_results(args.results).to_pylist()
    rows = [r for r in rows if (args.run is None or r["run_id"] == args.run)
            and (args.since is None or r["started_at"].isoformat() >= args.since)
            and (args.until is None or r["started_at"].isoformat() < args.until)]
    table = case_times(rows)
    if not table:
        print(f"no timed profile rows under {args.results}", file=sys.stderr)
        return 2
    print("| op | tp | placement | cases | wall (s) | timed replays (s) | build (s) | rest (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (op, tp, placement), (n, wall, timed, build) in sorted(table.items()):
        print(f"| {op} | {tp} | {placement} | {n} | {wall:.1f} | {timed:.1f} | {build:.1f} | "
              f"{wall - timed - build:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
