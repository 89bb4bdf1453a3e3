"""Print the latency table of a profile run: per (op, tp, hidden, M), the
fused kernel's median (max over ranks) beside every baseline's, and ours /
each baseline. Reads the rows ``python -m jobs profile`` wrote.

    python3 scripts/gpu/latency_table.py /tmp/results [--run RUN_ID] [--markdown PATH] [--ranks]

``--ranks`` adds, for every timed row of a group (tp > 1), the calls one
graph held, each rank's own median and their spread: where a graph holds
few calls, the rank that starts a replay first carries the start skew in
its time (docs/results/service_h200x2_2026-11-30.md section 10).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/latency_table.py")
    p.add_argument("results")
    p.add_argument("--run", default=None, help="run id (default: the latest run)")
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--ranks", action="store_true",
                   help="also print each rank's median beside the max over ranks")
    args = p.parse_args(argv)
    import json

    from jobs.results import read_results
    rows = [r for r in read_results(args.results).to_pylist() if r.get("job") == "profile"]
    if not rows:
        print(f"no profile rows under {args.results}", file=sys.stderr)
        return 2
    run = args.run or max(rows, key=lambda r: r["started_at"])["run_id"]
    rows = [r for r in rows if r["run_id"] == run]
    cells: dict[tuple, dict[str, str]] = defaultdict(dict)
    impls: list[str] = []
    ours: dict[tuple, float] = {}
    for r in rows:
        extra = json.loads(r.get("extra") or "{}")
        # an owner-mode case: ours carries mode="owner", its baseline is the one-shot kernel
        owner = extra.get("mode") == "owner" or r["variant"] == "baseline:one_shot"
        mode = "owner" if owner else "one_shot"
        key = (r["op"], mode, r["tp"], r["hidden"], r["tokens"])
        variant = r["variant"] or ""
        impl = variant.split(":", 1)[1] if variant.startswith("baseline:") else "ours"
        if impl not in impls:
            impls.append(impl)
        t = r.get("t_median_us")
        cells[key][impl] = f"{t:.2f}" if t is not None else (
            "n/a" if r["outcome"] == "skipped" else r["outcome"])
        if impl == "ours" and t is not None:
            ours[key] = t
    impls.sort(key=lambda i: (i != "ours", i))
    header = ["op", "mode", "tp", "hidden", "M", *[f"{i} (us)" for i in impls],
              *[f"ours/{i}" for i in impls if i != "ours"]]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for key in sorted(cells):
        c = cells[key]
        ratios = []
        for i in impls[1:]:
            try:
                ratios.append(f"{ours[key] / float(c[i]):.2f}")
            except (KeyError, ValueError, ZeroDivisionError):
                ratios.append("")
        lines.append("| " + " | ".join([*map(str, key), *(c.get(i, "") for i in impls),
                                         *ratios]) + " |")
    if args.ranks:
        lines += ["", *rank_table(rows)]
    text = f"run {run}\n" + "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


def rank_table(rows: list[dict]) -> list[str]:
    """Markdown lines: per timed group row (tp > 1), calls per graph, each
    rank's median (us), max minus min of those, the max-over-ranks median."""
    import json
    lines = ["| op | tp | hidden | M | impl | calls per graph | rank medians (us) | "
             "spread (us) | max-over-ranks median (us) |", "|" + " --- |" * 9]
    keyed = []
    for r in rows:
        extra = json.loads(r.get("extra") or "{}")
        medians = extra.get("rank_median_us") or []
        if r.get("tp", 1) < 2 or len(medians) < 2 or r.get("t_median_us") is None:
            continue
        impl = extra.get("impl") or "fused"
        if extra.get("mode") == "owner" and impl == "fused":
            impl = "fused (owner)"
        keyed.append(((r["op"], r["tp"], r["hidden"], r["tokens"], impl),
                      extra.get("calls_per_graph"), medians, r["t_median_us"]))
    for (op, tp, hidden, m, impl), calls, medians, median in sorted(keyed, key=lambda k: k[0]):
        lines.append(f"| {op} | {tp} | {hidden} | {m} | {impl} | {calls} | "
                     f"{' / '.join(f'{v:.2f}' for v in medians)} | "
                     f"{max(medians) - min(medians):.2f} | {median:.2f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
