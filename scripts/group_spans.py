"""Where a job's wall time went, from its rows' start and end times: the
time inside TP groups and between them (group set-up), and per placement
and tp the groups, cases, summed group spans, time per case and the median
case after each group's first (where a group's compiles land). A group is
the rows of one ``extra.group_id`` (rank-actor groups); rows without one (a
virtual-rank group is one GPU task, untagged; ``jobs.simulate.group_spans``
leaves them out) are grouped by (op, placement, tp, hidden, mode, finalize).

    python3 scripts/group_spans.py RESULTS [--run RUN_ID] [--job correctness]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/group_spans.py")
    p.add_argument("results")
    p.add_argument("--run", default=None, help="run id (default: every run in RESULTS)")
    p.add_argument("--job", default="correctness", help="job (default: %(default)s)")
    args = p.parse_args(argv)
    from jobs.results import read_results
    filters = {"job": args.job, **({"run_id": args.run} if args.run else {})}
    rows = sorted(read_results(args.results, filters=filters).to_pylist(),
                  key=lambda r: r["started_at"])
    if not rows:
        print(f"no {args.job} rows in {args.results}" + (f" (run {args.run})" if args.run else ""),
              file=sys.stderr)
        return 1
    groups = defaultdict(list)
    for r in rows:
        x = json.loads(r["extra"] or "{}")
        groups[(r["op"], r["placement"], r["tp"],
                x.get("group_id") or (r["hidden"], x.get("mode"), x.get("finalize")))].append(r)
    spans = sorted((min(r["started_at"] for r in g), max(r["finished_at"] for r in g))
                   for g in groups.values())
    inside = sum((e - s).total_seconds() for s, e in spans)
    between = sum(max(0.0, (b[0] - a[1]).total_seconds()) for a, b in zip(spans, spans[1:]))
    elapsed = (rows[-1]["finished_at"] - rows[0]["started_at"]).total_seconds()
    print(f"{len(rows)} {args.job} rows on {len(groups)} groups: {elapsed:.0f} s from the first "
          f"case's start to the last one's end; {inside:.0f} s inside groups, {between:.0f} s "
          f"between them")
    by = defaultdict(lambda: {"groups": 0, "cases": 0, "span": 0.0, "later": []})
    for (op, placement, tp, *_), g in groups.items():
        b = by[(placement, tp)]
        b["groups"] += 1
        b["cases"] += len(g)
        b["span"] += (max(r["finished_at"] for r in g) - min(r["started_at"] for r in g)).total_seconds()
        b["later"] += sorted((r["finished_at"] - r["started_at"]).total_seconds() for r in g)[1:]
    print(f"{'placement':<16}{'tp':>4}{'groups':>8}{'cases':>7}{'span_s':>9}{'per_case_s':>12}"
          f"{'later_median_s':>16}")
    for (placement, tp), b in sorted(by.items()):
        later = f"{statistics.median(b['later']):.2f}" if b["later"] else "-"
        print(f"{placement:<16}{tp:>4}{b['groups']:>8}{b['cases']:>7}{b['span']:>9.1f}"
              f"{b['span'] / b['cases']:>12.2f}{later:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
