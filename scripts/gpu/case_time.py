"""Where a run's correctness and fault time went, from its rows: a case's
time is its row's ``finished_at - started_at`` (groups of a layout run at
once, so case times overlap and add up to more than the wall).

- faults, per fault kind: cases run, summed and largest case time, how many
  rebuilt their group (``extra.rebuilt``) and how many paid a group's kernel
  preparation (``extra.prepare_s``; rows from before these were recorded
  show ``-``); then the cases run, their time and the mean per case beyond
  the stuck-rank kind, whose cases rebuild their group;
- correctness, per (op, tp, placement): cases and summed case time (a
  virtual-rank group is one batch: its time is on its first row), and the
  cases' host time by phase (``extra.phases_s``, :mod:`cluster.phases`;
  ``-`` for rows from before it was recorded);
- ``--spans``: each correctness group's span, seconds from the job's first
  case: first case start, last case end, its placement, tp, hidden, cases,
  modes, its build's wall time (``extra.group_build_s``; a virtual-rank
  task's start and imports, ``task_start_s + imports_s``; ``-`` for rows
  from before these were recorded) and of it the wait for a pool's lease
  (``extra.group_lease_s``, recorded since 2026-12-02); a group is ``extra.group_id`` (a
  virtual-rank task has none, so its first row, which carries the task's
  start, and the rest of its rows show as two spans); in start order:
  where the wall went between groups.

- ``--svg FILE``: the spans drawn as a timeline (an SVG), for the pages.

    python3 scripts/gpu/case_time.py RESULTS [--run RUN_ID] [--spans] [--svg FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

REBUILDING_KINDS = ("stuck_rank", "dirty_mailbox")
"""Fault kinds whose cases end with their group rebuilt (a rank killed)."""


def seconds(row: dict) -> float:
    return (row["finished_at"] - row["started_at"]).total_seconds()


def fault_table(rows: list[dict]) -> tuple[list[list], tuple[int, float]]:
    """Per fault kind: [kind, cases, summed s, max s, rebuilt, paid preparation];
    and (cases, summed s) over the kinds that do not rebuild their group."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["job"] == "faults" and r["outcome"] != "skipped":
            by_kind[r["fault_kind"]].append(r)
    table, rest = [], [0, 0.0]
    for kind, rs in sorted(by_kind.items()):
        extras = [json.loads(r.get("extra") or "{}") for r in rs]
        times = [seconds(r) for r in rs]
        rebuilt = sum(bool(x.get("rebuilt")) for x in extras) if any(
            "rebuilt" in x for x in extras) else None
        prepared = sum(bool(x.get("prepare_s")) for x in extras) if rebuilt is not None else None
        table.append([kind, len(rs), sum(times), max(times), rebuilt, prepared])
        if kind not in REBUILDING_KINDS:
            rest[0] += len(rs)
            rest[1] += sum(times)
    return table, (rest[0], rest[1])


def correctness_table(rows: list[dict]) -> list[list]:
    """Per (op, tp, placement): [op, tp, placement, cases, summed s, then per
    phase of :data:`cluster.phases.PHASES` its summed s or None where no
    row recorded it]."""
    from cluster.phases import PHASES
    out: dict[tuple, list] = defaultdict(lambda: [0, 0.0, {}])
    for r in rows:
        if r["job"] == "correctness" and r["outcome"] != "skipped":
            cell = out[(r["op"], r["tp"], r["placement"])]
            cell[0] += 1
            cell[1] += seconds(r)
            for phase, s in (json.loads(r.get("extra") or "{}").get("phases_s") or {}).items():
                cell[2][phase] = cell[2].get(phase, 0.0) + s
    return [[*key, n, s, *(by.get(p) for p in PHASES)]
            for key, (n, s, by) in sorted(out.items(), key=lambda kv: str(kv[0]))]


def group_spans(rows: list[dict]) -> list[list]:
    """Correctness groups as [start s, end s, op, placement, tp, hidden,
    cases, modes, build s or None, lease s or None], seconds from the
    earliest case start, in start order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["job"] == "correctness" and r["outcome"] != "skipped":
            x = json.loads(r.get("extra") or "{}")
            key = x.get("group_id") or (r["op"], r["placement"], r["tp"], r["hidden"],
                                        round(seconds(r), 1) if seconds(r) > 1 else None)
            groups[key].append(r)
    if not groups:
        return []
    t0 = min(r["started_at"] for rs in groups.values() for r in rs)
    out = []
    for rs in groups.values():
        extras = [json.loads(r.get("extra") or "{}") for r in rs]
        modes = sorted({str(x.get("mode")) for x in extras})
        builds = [x["group_build_s"] if "group_build_s" in x else
                  x["task_start_s"] + x.get("imports_s", 0.0) for x in extras
                  if "group_build_s" in x or "task_start_s" in x]
        leases = [x["group_lease_s"] for x in extras if "group_lease_s" in x]
        out.append([(min(r["started_at"] for r in rs) - t0).total_seconds(),
                    (max(r["finished_at"] for r in rs) - t0).total_seconds(), rs[0]["op"],
                    rs[0]["placement"], rs[0]["tp"], rs[0]["hidden"], len(rs), ",".join(modes),
                    max(builds) if builds else None, max(leases) if leases else None])
    return sorted(out)


PLACEMENT_COLOURS = {"process-per-gpu": "#4c72b0", "shared-gpu": "#dd8452",
                     "virtual-ranks": "#55a868"}
"""A span's colour by its placement (any other: grey)."""


def spans_svg(spans: list[list], title: str) -> str:
    """:func:`group_spans` as an SVG timeline: a line a group in start
    order, its cases as a bar coloured by placement, its build before it
    (grey; of it the lease wait darker), seconds from the first case on x."""
    from html import escape
    left, right, top, line, px_per_s = 250, 20, 40, 13, 8.0
    end = max(s[1] for s in spans)
    start = min(min(s[0] - (s[8] or 0.0) for s in spans), 0.0)
    width = round(left + (end - start) * px_per_s + right)
    height = top + line * len(spans) + 40

    def x(t: float) -> float:
        return left + (t - start) * px_per_s
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<!-- Generated from a run\'s rows by scripts/gpu/case_time.py (its svg option). -->',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="10" fill="#222">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="10" y="16" font-size="13" font-weight="bold">{escape(title)}</text>']
    for t in range(int(start // 10) * 10, int(end) + 10, 10):
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 6}" x2="{x(t):.1f}" '
                   f'y2="{height - 28}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x(t):.1f}" y="{height - 16}" text-anchor="middle">{t} s</text>')
    for i, (s0, s1, op, placement, tp, hidden, cases, _, build, lease) in enumerate(spans):
        y = top + i * line
        out.append(f'<text x="{left - 6}" y="{y + 9}" text-anchor="end">'
                   f'{escape(f"{op} tp{tp} {hidden} ({cases})")}</text>')
        if build:
            out.append(f'<rect x="{x(s0 - build):.1f}" y="{y + 2}" width="{build * px_per_s:.1f}" '
                       f'height="{line - 4}" fill="#c8c8c8"><title>build {build:.2f} s'
                       f'</title></rect>')
        if lease:
            out.append(f'<rect x="{x(s0 - build):.1f}" y="{y + 2}" width="{lease * px_per_s:.1f}" '
                       f'height="{line - 4}" fill="#8c8c8c"><title>lease {lease:.2f} s'
                       f'</title></rect>')
        colour = PLACEMENT_COLOURS.get(placement, "#999999")
        out.append(f'<rect x="{x(s0):.1f}" y="{y + 1}" width="{max((s1 - s0) * px_per_s, 1):.1f}" '
                   f'height="{line - 2}" fill="{colour}"><title>{escape(placement)}: '
                   f'{s0:.1f}-{s1:.1f} s</title></rect>')
    lx = 10
    for name, colour in [*PLACEMENT_COLOURS.items(), ("build", "#c8c8c8"),
                         ("of it, lease wait", "#8c8c8c")]:
        out.append(f'<rect x="{lx}" y="26" width="10" height="8" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14}" y="34">{escape(name)}</text>')
        lx += 14 + 6 * len(name) + 14
    return "\n".join(out + ["</svg>", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/case_time.py")
    p.add_argument("results")
    p.add_argument("--run", default=None, help="run id (default: every run)")
    p.add_argument("--spans", action="store_true",
                   help="also each correctness group's span (start, end, what it ran)")
    p.add_argument("--svg", default=None, metavar="FILE",
                   help="also draw the spans as a timeline into FILE (an SVG)")
    args = p.parse_args(argv)
    from jobs.results import read_results
    rows = [r for r in read_results(args.results).to_pylist()
            if args.run is None or r["run_id"] == args.run]
    faults, (n, total) = fault_table(rows)
    correctness = correctness_table(rows)
    if not faults and not correctness:
        print(f"no correctness or fault rows under {args.results}", file=sys.stderr)
        return 2

    def opt(v):
        return "-" if v is None else v
    if faults:
        print("| fault kind | cases | case time (s) | largest (s) | rebuilt their group "
              "| paid kernel preparation |")
        print("| --- | --- | --- | --- | --- | --- |")
        for kind, cases, summed, largest, rebuilt, prepared in faults:
            print(f"| {kind} | {cases} | {summed:.1f} | {largest:.2f} | {opt(rebuilt)} "
                  f"| {opt(prepared)} |")
        if n:
            print(f"\nbeyond {', '.join(REBUILDING_KINDS)}: {n} cases, {total:.1f} s, "
                  f"{total / n:.2f} s a case\n")
    if correctness:
        from cluster.phases import PHASES
        print("| op | tp | placement | cases | case time (s) | "
              + " | ".join(f"{p} (s)" for p in PHASES) + " |")
        print("| --- " * (5 + len(PHASES)) + "|")
        for op, tp, placement, cases, summed, *by in correctness:
            print(f"| {op} | {tp} | {placement} | {cases} | {summed:.1f} | "
                  + " | ".join("-" if v is None else f"{v:.2f}" for v in by) + " |")
    if args.spans and correctness:
        print("\n| start (s) | end (s) | op | placement | tp | hidden | cases | modes "
              "| build (s) | of it, lease (s) |")
        print("| --- " * 10 + "|")
        for start, end, op, placement, tp, hidden, cases, modes, build, lease in group_spans(rows):
            print(f"| {start:.1f} | {end:.1f} | {op} | {placement} | {tp} | {hidden} | {cases} "
                  f"| {modes} | {'-' if build is None else f'{build:.1f}'} "
                  f"| {'-' if lease is None else f'{lease:.1f}'} |")
    if args.svg and correctness:
        runs = sorted({r["run_id"] for r in rows if r["job"] == "correctness"})
        with open(args.svg, "w") as f:
            f.write(spans_svg(group_spans(rows), f"correctness groups of {', '.join(runs)}: "
                                                 f"seconds from the first case"))
        print(f"\nwrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
