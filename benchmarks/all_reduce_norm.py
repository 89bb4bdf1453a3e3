"""Benchmark: fused Lamport publish + norm vs torch add + rms_norm, tp=1.

    python -m benchmarks.all_reduce_norm [--tokens 1,8,16,64] [--hidden 5120,7168]
        [--calls 50] [--replays 200] [--budget-ns NS] [--markdown PATH] [--results DIR]
        [--forms [--op finalize_publish] [--top-k 8]]

Timed through the one harness (:func:`cluster.measure.timing.measure_tp1`,
the profile job's tp=1 path): each side is one CUDA graph holding
max(``--calls``, R) back-to-back calls, each replay timed with CUDA events,
per-call time = replay time / calls; call i reads input set i % R, the R
sets spanning at least ``--rotate-mb`` (default twice the H200's 60 MB L2).
The fused outputs are checked against the reference before timing. Reported: medians (and p10/p90) over
``--replays`` replays in microseconds, the fused/torch ratio, and the
watchdog variant's overhead over the plain consumer. tp=1 only: virtual-rank
timings are not a collective's speed (every peer store lands in local L2).

``--forms``: instead, the one-shot forms side by side, of the plain op or,
with ``--op finalize_publish``, of a MoE output's call (``--top-k`` routes
a token, every route held, FP32 weights, a shared expert; torch is the
unfused finalize, add and rms_norm), or with ``--op embed_norm`` of the
embedding's (torch: the gather, enorm and hnorm unfused)
(:mod:`kernels.lamport.norm_tuning`): the two-kernel form (publish, then
the consumer) and the single kernel with each stage agreement (the arrival
counter; the grid as one cluster with the cluster barrier, at M 2..16; none,
at tp = 1), each against torch add + rms_norm; plain consumers (no watchdog) unless
``--budget-ns`` is given with ``--forms``, which times the watchdog builds
instead. The table's ``auto`` column says which the form table picks.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

from benchmarks import int_list
from kernels.lamport.protocol import DEFAULT_BUDGET_NS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.all_reduce_norm")
    p.add_argument("--tokens", type=int_list, default=[1, 8, 16, 64])
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--budget-ns", type=int, default=None,
                   help="the watchdog builds' budget (default: the cases' "
                        f"{DEFAULT_BUDGET_NS} ns; with --forms: plain builds unless given)")
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0,
                   help="rotate through input sets spanning at least this many MB")
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--results", type=Path, default=None,
                   help="also write the timings as profile rows into this results dataset")
    p.add_argument("--forms", action="store_true",
                   help="time the two-kernel and the single-kernel form side by side")
    p.add_argument("--op", choices=form_ops(), default="all_reduce_norm",
                   help="with --forms: the op whose forms are timed (finalize_publish: a MoE "
                        "output's call; embed_norm: the embedding's)")
    p.add_argument("--top-k", type=int, default=8, help="with --op finalize_publish: routes "
                                                        "a token")
    args = p.parse_args(argv)
    if args.op != "all_reduce_norm" and not args.forms:
        p.error(f"--op {args.op} times the forms only: add --forms")
    if args.top_k < 1:
        p.error(f"--top-k must be >= 1, got {args.top_k}")
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2

    from benchmarks.rows import BenchmarkRows

    rows = BenchmarkRows(args.results, "python -m benchmarks.all_reduce_norm")
    if args.forms:
        budget = args.budget_ns or 0
        lines = forms(args, rows, budget)
        meta_extra = (f", forms of {args.op}"
                      + (f" (top_k={args.top_k})" if "top_k" in _fields(args.op) else "")
                      + f", budget_ns={budget}")
    else:
        args.budget_ns = args.budget_ns or DEFAULT_BUDGET_NS
        lines = plain_and_watchdog(args, rows)
        meta_extra = f", budget_ns={args.budget_ns}"
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"calls/graph=max({args.calls}, input sets), replays={args.replays}{meta_extra}, "
            f"inputs rotated over >= {args.rotate_mb:g} MB")
    print(meta)
    rows.close()
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines) + "\n" + meta + "\n```\n")
    return 0


def _spec(args, hidden: int, m: int, **over) -> dict:
    return {**dict(op="all_reduce_norm", hidden=hidden, tokens=m, calls=args.calls,
                   replays=args.replays, rotate_mb=args.rotate_mb, eps=args.eps, seed=m,
                   budget_ns=0, baselines=["unfused"]), **over}


def _fields(op: str):
    from cluster import ops
    return ops.get(op).fields


def form_ops() -> list[str]:
    """The ops whose calls the form table (kernels.lamport.norm_tuning)
    chooses for: those declaring a ``form`` field (the registry's word)."""
    from cluster import ops
    return [name for name in ops.names() if "form" in ops.get(name).fields]


def _start(header: str) -> list[str]:
    """Print a table's header and rule; returns them, the table's first lines."""
    lines = [header, "-" * len(header)]
    print("\n".join(lines), flush=True)
    return lines


FORM_COLUMNS = (("two", "two"), ("single", "counter"), ("single+cluster", "barrier"),
                ("single+nosync", "nosync"))
"""The forms ``--forms`` times (kernels.lamport.norm_tuning.FORMS) and their
columns: two kernels, then the single kernel with each agreement (``barrier``:
the cluster barrier)."""


def forms(args, rows, budget_ns: int) -> list[str]:
    """Every one-shot form (two kernels; the single kernel with each stage
    agreement: the arrival counter, the cluster barrier at M 2..16, none)
    and torch, per (hidden, M), in this process; ``auto`` is the variant
    the form table picks (the ``auto`` form's run names it)."""
    from cluster.measure.stats import median_p10_p90
    from cluster.measure.timing import measure_tp1
    from kernels.lamport.norm_tuning import CLUSTER_MAX_TOKENS

    header = (f"{'hidden':>6} {'M':>4} " + " ".join(f"{c + '_us':>10}" for _, c in FORM_COLUMNS)
              + f" {'torch_us':>9} " + " ".join(f"{c + '/torch':>13}" for _, c in FORM_COLUMNS)
              + f" {'auto':>14}")
    lines = _start(header)
    for hidden in args.hidden:
        for m in args.tokens:
            here = [f for f, _ in FORM_COLUMNS
                    if f != "single+cluster" or 2 <= m <= CLUSTER_MAX_TOKENS]
            routed = "top_k" in _fields(args.op)
            op = dict(op=args.op, **({"top_k": args.top_k} if routed else {}))
            # "auto" too: its row names the variant the table picks for this op.
            outs = {f: measure_tp1(_spec(args, hidden, m, form=f, budget_ns=budget_ns, **op,
                                         **({} if f == "two" else {"baselines": []})))
                    for f in [*here, "auto"]}
            for f, out in outs.items():
                rows.record(_spec(args, hidden, m, form=f, budget_ns=budget_ns, **op), out)
            ref = median_p10_p90(outs["two"]["impls"]["unfused"]["times_us"])[0]
            us = {f: median_p10_p90(out["impls"]["fused"]["times_us"])[0]
                  for f, out in outs.items() if f != "auto"}
            cells = [f"{us[f]:>10.2f}" if f in us else f"{'-':>10}" for f, _ in FORM_COLUMNS]
            ratios = [f"{us[f] / ref:>13.2f}" if f in us else f"{'-':>13}"
                      for f, _ in FORM_COLUMNS]
            auto = outs["auto"]["impls"]["fused"]["extra"]["variant"]
            row = (f"{hidden:>6} {m:>4} " + " ".join(cells) + f" {ref:>9.2f} "
                   + " ".join(ratios) + f" {auto:>14}")
            print(row, flush=True)
            lines.append(row)
    return lines


def plain_and_watchdog(args, rows) -> list[str]:
    """The fused op (the form table's form) and torch, and its watchdog build."""
    header = (f"{'hidden':>6} {'M':>4} {'fused_us':>9} {'p10':>7} {'p90':>7} {'torch_us':>9} "
              f"{'ratio':>6} {'watchdog_us':>11} {'wd_overhead':>11} {'rotated_mb':>10}")
    lines = _start(header)
    for hidden in args.hidden:
        for m in args.tokens:
            plain, _ = rows.plain_and_watchdog(_spec(args, hidden, m), args.budget_ns)
            fused, ref, watchdog = plain["stats"]
            row = (f"{hidden:>6} {m:>4} {fused[0]:>9.2f} {fused[1]:>7.2f} {fused[2]:>7.2f} "
                   f"{ref[0]:>9.2f} {fused[0] / ref[0]:>6.2f} {watchdog[0]:>11.2f} "
                   f"{(watchdog[0] / fused[0] - 1) * 100:>10.1f}% "
                   f"{plain['sets'] * plain['set_bytes'] / 2**20:>10.0f}")
            print(row, flush=True)
            lines.append(row)
    return lines


if __name__ == "__main__":
    sys.exit(main())
