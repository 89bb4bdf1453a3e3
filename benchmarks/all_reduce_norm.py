"""Benchmark: fused Lamport publish + norm vs torch add + rms_norm, tp=1.

    python -m benchmarks.all_reduce_norm [--tokens 1,8,16,64] [--hidden 5120,7168]
        [--calls 50] [--replays 200] [--budget-ns 1000000000] [--markdown PATH]
        [--results DIR]

Timed through the one harness (:func:`cluster.measure.timing.measure_tp1`,
the profile job's tp=1 path): each side is one CUDA graph holding
max(``--calls``, R) back-to-back calls, each replay timed with CUDA events,
per-call time = replay time / calls; call i reads input set i % R, the R
sets spanning at least ``--rotate-mb`` (default twice the H200's 60 MB L2).
The fused outputs are checked against the reference before timing. Reported: medians (and p10/p90) over
``--replays`` replays in microseconds, the fused/torch ratio, and the
watchdog variant's overhead over the plain consumer. tp=1 only: virtual-rank
timings are not a collective's speed (every peer store lands in local L2).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

from benchmarks import int_list


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.all_reduce_norm")
    p.add_argument("--tokens", type=int_list, default=[1, 8, 16, 64])
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--budget-ns", type=int, default=1_000_000_000)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0,
                   help="rotate through input sets spanning at least this many MB")
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--results", type=Path, default=None,
                   help="also write the timings as profile rows into this results dataset")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2

    from benchmarks.rows import BenchmarkRows

    rows = BenchmarkRows(args.results, "python -m benchmarks.all_reduce_norm")

    header = (f"{'hidden':>6} {'M':>4} {'fused_us':>9} {'p10':>7} {'p90':>7} {'torch_us':>9} "
              f"{'ratio':>6} {'watchdog_us':>11} {'wd_overhead':>11} {'rotated_mb':>10}")
    lines = [header, "-" * len(header)]
    print(header)
    print(lines[1])
    for hidden in args.hidden:
        for m in args.tokens:
            spec = dict(op="all_reduce_norm", hidden=hidden, tokens=m, calls=args.calls,
                        replays=args.replays, rotate_mb=args.rotate_mb, eps=args.eps, seed=m,
                        budget_ns=0, baselines=["unfused"])
            plain, _ = rows.plain_and_watchdog(spec, args.budget_ns)
            fused, ref, watchdog = plain["stats"]
            row = (f"{hidden:>6} {m:>4} {fused[0]:>9.2f} {fused[1]:>7.2f} {fused[2]:>7.2f} "
                   f"{ref[0]:>9.2f} {fused[0] / ref[0]:>6.2f} {watchdog[0]:>11.2f} "
                   f"{(watchdog[0] / fused[0] - 1) * 100:>10.1f}% "
                   f"{plain['sets'] * plain['set_bytes'] / 2**20:>10.0f}")
            print(row, flush=True)
            lines.append(row)
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"calls/graph=max({args.calls}, input sets), replays={args.replays}, budget_ns={args.budget_ns}, "
            f"inputs rotated over >= {args.rotate_mb:g} MB")
    print(meta)
    rows.close()
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
