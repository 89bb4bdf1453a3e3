"""Compact text of an Nsight Compute report (scripts/gpu/indexer_ncu.sh,
scripts/gpu/allreduce_ncu.sh).

    python3 scripts/gpu/ncu_summary.py LAUNCHES DETAILS_CSV RAW_CSV

LAUNCHES: the ``ncu launch: LABEL xN`` lines the profiled program printed
(each label stands for its next N profiled launches, in order); DETAILS_CSV and RAW_CSV:
``ncu -i REPORT --csv --page details`` / ``--page raw``. Prints per profiled
launch its label, grid/block/cluster, duration, achieved DRAM read bandwidth,
occupancy and waves, and the largest stall reasons (warps stalled per issued
instruction). Metric names missing from a report are skipped, not guessed.
"""

from __future__ import annotations

import csv
import re
import sys

#: Metrics of the details page, by display name (section shown in brackets).
DETAILS = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Cache Throughput",
           "Compute (SM) Throughput", "Grid Size", "Block Size", "Cluster Size",
           "Registers Per Thread", "Dynamic Shared Memory Per Block", "Waves Per SM",
           "Theoretical Occupancy", "Achieved Occupancy", "Warp Cycles Per Issued Instruction",
           "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler",
           "Eligible Warps Per Scheduler", "L2 Hit Rate")
DETAILS_WORDS = ("NVLink", "Nvlink", "NVLINK")
"""Details metrics whose name holds one of these are kept too (the NVLink sections)."""
#: Raw metrics: exact names, then every metric starting with a prefix.
RAW = ("gpu__time_duration.sum", "gpc__cycles_elapsed.max",
       "device__attribute_multiprocessor_count", "sm__cycles_active.avg", "sm__cycles_active.max",
       "sm__warps_active.avg.pct_of_peak_sustained_active")
RAW_PREFIXES = ("dram__bytes", "dram__throughput", "launch__grid_size", "launch__cluster_dim",
                "launch__block_size", "launch__thread_block_size", "launch__registers_per_thread",
                "launch__waves_per_multiprocessor", "launch__occupancy_limit",
                "launch__shared_mem_per_block", "nvlrx__", "nvltx__",
                # the loads through L1 (MemoryWorkloadAnalysis_Tables): requests,
                # sectors, and the shared-memory wavefronts of ld.shared
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld")
STALL = re.compile(r"issue_stalled_(\w+?)(?:_per_\w+)?\.ratio$")
TOP_STALLS = 8


def launch_labels(path: str) -> list[str]:
    """One label per profiled launch (``... xN`` expands to N)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("ncu launch: "):
                label, _, count = line[len("ncu launch: "):].strip().rpartition(" x")
                out += [label] * int(count)
    return out


def details(path: str) -> dict[str, list[tuple[str, str, str]]]:
    """ID -> [(metric name, value, unit)] of the selected details metrics."""
    out: dict[str, list] = {}
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next((i for i, r in enumerate(rows) if "ID" in r and "Metric Name" in r), None)
    if head is None:
        return out
    cols = {n: i for i, n in enumerate(rows[head])}
    need = max(cols[c] for c in ("ID", "Metric Name", "Metric Value"))
    seen = set()
    for r in rows[head + 1:]:
        if len(r) <= need:
            continue
        name = r[cols["Metric Name"]]
        key = (r[cols["ID"]], name)
        wanted = name in DETAILS or any(w in name for w in DETAILS_WORDS)
        if wanted and key not in seen:
            seen.add(key)
            out.setdefault(r[cols["ID"]], []).append(
                (name, r[cols["Metric Value"]], r[cols.get("Metric Unit", cols["Metric Value"])]))
    return out


def raw(path: str) -> list[dict[str, str]]:
    """One dict a launch: metric name -> 'value unit' (raw page: header, a
    units row whose ID cell is empty, then one row a launch)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next((i for i, r in enumerate(rows) if "ID" in r), None)
    if head is None:
        return []
    names, rest = rows[head], rows[head + 1:]
    id_col = names.index("ID")
    units = [""] * len(names)
    if rest and not rest[0][id_col].strip().isdigit():
        units, rest = rest[0], rest[1:]
    return [{n: f"{v} {u}".strip() for n, v, u in zip(names, r, units)} for r in rest]


def _number(text: str) -> float:
    try:
        return float(text.split()[0].replace(",", ""))
    except (ValueError, IndexError):
        return float("nan")


def summary(labels, det, launches) -> str:
    lines = []
    ids = sorted(det, key=int) if det else [str(i) for i in range(len(launches))]
    for n, launch_id in enumerate(ids):
        label = labels[n] if n < len(labels) else "?"
        lines.append(f"[{launch_id}] {label}")
        for name, value, unit in det.get(launch_id, []):
            lines.append(f"    {name}: {value} {unit}".rstrip())
        r = launches[n] if n < len(launches) else {}
        if r.get("Kernel Name", "").strip():
            lines.append(f"    kernel: {r['Kernel Name'].strip()[:120]}")
        for name in RAW + tuple(k for k in r if k.startswith(RAW_PREFIXES)):
            if name in r and r[name].strip():
                lines.append(f"    {name}: {r[name]}")
        stalls = [(STALL.search(k).group(1), _number(v)) for k, v in r.items() if STALL.search(k)]
        stalls = sorted((s for s in stalls if s[1] == s[1]), key=lambda s: -s[1])[:TOP_STALLS]
        if stalls:
            lines.append("    stalls (warps per issue): "
                         + ", ".join(f"{s} {v:.2f}" for s, v in stalls))
    if len(labels) != len(ids):
        lines.append(f"note: {len(labels)} launches listed, {len(ids)} profiled")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    det = details(argv[1])
    print(summary(launch_labels(argv[0]), det, raw(argv[2])))
    if not det:  # show the details page's shape, so the parser can be fixed
        with open(argv[1]) as f:
            print("details page: no selected metric found; its first lines:")
            print("".join(f.readlines()[:3])[:1500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
