"""Benchmark: AllReduceMHC (fused Lamport publish + mHC consumer) at tp=1 vs
the unfused torch path, and the tuning sweep that justifies
:mod:`kernels.lamport.mhc_tuning`.

    python -m benchmarks.all_reduce_mhc [--tokens 1,8,16,64] [--hidden 5120,7168]
        [--hc 4] [--calls 50] [--replays 200] [--budget-ns 1000000000]
        [--markdown PATH] [--results DIR]
    python -m benchmarks.all_reduce_mhc --sweep [--hidden 5120,7168] [--tokens 1,16,64]
        [--sweep-tp 1,8] [--clusters 5,7] [--threads 128,256] [--rank-lanes 1,2]
        [--markdown PATH]

Default mode (tp=1): the fused op with the table's tuning, its watchdog
build, and the unfused torch path (post-mix + comb-weighted streams, BF16
streams, collapse with pre, BF16, ``torch.nn.functional.rms_norm``; at tp=1
the all-reduce is the identity). Each side is one CUDA graph holding
max(``--calls``, R) back-to-back calls, timed with CUDA events per replay
(per-call time = replay time / calls); call i reads input set i % R, the R
sets spanning at least ``--rotate-mb`` (default 120 MB, twice the H200's L2)
so nothing is timed on L2-resident inputs. Reported: medians and p10/p90 in
microseconds, fused/torch ratio, watchdog overhead. Outputs are checked
against the reference once before timing (residual streams bit-exact,
layer input within 1 BF16 ULP).

Sweep mode: every valid (cluster_size, threads, rank_lanes) at each hidden
(cluster 1..8, threads 64..1024, rank lanes dividing tp, at most
``MAX_TRIPS`` trips), timed the same way; the table's choice is marked
``*`` and the fastest ``<``. At tp=1 the timings are real; at tp > 1 they
are virtual ranks on one GPU (every rank's publish and consumer in the
graph, peer stores landing in local L2): NOT a collective's speed, only a
comparison of consumer tunings with one another (rank lanes need tp > 1).

Each sweep row is printed as it is measured ("measured ..."), then the
marked table per hidden. At tp > 1 a graph holds at most
:data:`VIRTUAL_MAX_CALLS` calls. The tp=1 sweep at hidden 5120 / 7168 / 8192,
the tp 2 / 4 / 8 sweep at 5120 / 7168 and the default comparison ran on the
H200 (docs/results/all_reduce_mhc_h200_2026-11-29.md, sections 2-6).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

from benchmarks import int_list
from cluster.measure.graph import rotating, rotation_sets, time_graph
from cluster.measure.stats import median_p10_p90


def _inputs(sets, m, hc, hidden, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf16 = torch.bfloat16
    return dict(
        x=torch.randn(sets, m, hidden, generator=g, device="cuda").to(bf16),
        residual=torch.randn(sets, m, hc, hidden, generator=g, device="cuda").to(bf16),
        post=2 * torch.rand(sets, m, hc, generator=g, device="cuda"),
        comb=torch.rand(sets, m, hc, hc, generator=g, device="cuda") / hc,
        pre=torch.rand(sets, m, hc, generator=g, device="cuda"),
        weight=(1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(bf16),
        res_out=torch.empty(sets, m, hc, hidden, dtype=bf16, device="cuda"),
        layer=torch.empty(sets, m, hidden, dtype=bf16, device="cuda"))


VIRTUAL_MAX_CALLS = 64
"""Calls a graph at most at tp > 1 (virtual ranks). Each virtual-ranks call
forks tp streams and joins them with events; replaying such a graph costs
more per call the more calls it holds (H200, tp=2, M=1, 5 x 256 R2: 7.6 /
10.2 / 16.6 us a call at 128 / 256 / 512 calls, ~30 us at 1117, and minutes
to capture; scripts/probe_mhc_graph.py), so the sweep's small-M rows would
time the graph, not the consumer. Capped, small-M inputs may stay in L2: the
tp > 1 rows are relative only anyway."""


def _sets(rotate_mb, m, hc, hidden, tp=1):
    set_bytes = tp * m * hidden * 2 + 2 * m * hc * hidden * 2 + m * hidden * 2
    sets = rotation_sets(rotate_mb, set_bytes)
    return (sets if tp == 1 else min(sets, VIRTUAL_MAX_CALLS)), set_bytes


def _check(res_out, layer, xs, data, i, eps, rank_lanes=1):
    from kernels.reference.mhc import all_reduce_mhc
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    ref_res, ref_layer = all_reduce_mhc(xs, data["residual"][i], data["post"][i],
                                        data["comb"][i], data["pre"][i], data["weight"], eps,
                                        rank_lanes=rank_lanes)
    assert_bit_exact(res_out, ref_res, "residual_out")
    assert_within_ulp(layer, ref_layer, 1, "layer_input")


def compare(args) -> list[str]:
    """Default mode, thin over the harness (:func:`cluster.measure.timing.measure_tp1`,
    the profile job's tp=1 path): the fused op (outputs checked first), its
    watchdog build and the torch path."""
    from benchmarks.rows import BenchmarkRows

    rows = BenchmarkRows(args.results, "python -m benchmarks.all_reduce_mhc")
    header = (f"{'hidden':>6} {'hc':>2} {'M':>4} {'tuning':>12} {'fused_us':>9} {'p10':>7} "
              f"{'p90':>7} {'torch_us':>9} {'ratio':>6} {'watchdog_us':>11} {'wd_overhead':>11} "
              f"{'rotated_mb':>10}")
    lines = [header, "-" * len(header)]
    print(header, lines[1], sep="\n")
    for hidden in args.hidden:
        for m in args.tokens:
            spec = dict(op="all_reduce_mhc", hidden=hidden, tokens=m, hc=args.hc,
                        calls=args.calls, replays=args.replays, rotate_mb=args.rotate_mb,
                        eps=args.eps, seed=m, budget_ns=0, baselines=["unfused"])
            plain, _ = rows.plain_and_watchdog(spec, args.budget_ns)
            f, r, w = plain["stats"]
            tuning = plain["impls"]["fused"]["extra"]["tuning"]
            row = (f"{hidden:>6} {args.hc:>2} {m:>4} {tuning:>12} {f[0]:>9.2f} "
                   f"{f[1]:>7.2f} {f[2]:>7.2f} {r[0]:>9.2f} {f[0] / r[0]:>6.2f} {w[0]:>11.2f} "
                   f"{(w[0] / f[0] - 1) * 100:>10.1f}% "
                   f"{plain['sets'] * plain['set_bytes'] / 2**20:>10.0f}")
            print(row, flush=True)
            lines.append(row)
    rows.close()
    return lines


def candidates(hidden, tp, clusters=None, threads_=None, rank_lanes=None):
    """Every valid geometry, optionally only those with the given cluster
    sizes / threads / rank lanes."""
    from kernels.lamport.mhc_tuning import MHCTuning, RANK_LANES, check_geometry

    out = []
    for cluster in clusters or range(1, 9):
        for threads in threads_ or (64, 128, 256, 512, 1024):
            for lanes in rank_lanes or RANK_LANES:
                try:
                    check_geometry(hidden=hidden, tp=tp, cluster_size=cluster, threads=threads,
                                   rank_lanes=lanes)
                except ValueError:
                    continue
                t = MHCTuning(cluster, threads, lanes)
                # drop geometries whose last trip leaves a whole CTA idle
                if cluster > 1 and t.trips(hidden) == 1 and \
                        (cluster - 1) * (threads // lanes) >= hidden // 8:
                    continue
                out.append(t)
    return out


def _sweep_row(hidden, tp, m, tuning, s, mark) -> str:
    return (f"{hidden:>6} {tp:>2} {m:>4} {tuning.cluster_size:>7} {tuning.threads:>7} "
            f"{tuning.rank_lanes:>2} {tuning.trips(hidden):>5} {s[0]:>8.2f} {s[1]:>7.2f} "
            f"{s[2]:>7.2f}  {mark}")


def sweep(args) -> list[str]:
    from kernels.all_reduce_mhc import AllReduceMHC
    from kernels.lamport.mhc_tuning import tuning_for

    header = (f"{'hidden':>6} {'tp':>2} {'M':>4} {'cluster':>7} {'threads':>7} {'R':>2} "
              f"{'trips':>5} {'us':>8} {'p10':>7} {'p90':>7}  mark")
    lines = [header, "-" * len(header)]
    print(header, lines[1], sep="\n")
    cap = max(args.tokens)
    for hidden in args.hidden:
        for tp in args.sweep_tp:
            chosen = tuning_for(hidden, tp)
            rows = []
            for tuning in candidates(hidden, tp, args.clusters, args.threads, args.rank_lanes):
                if tp == 1:
                    op = AllReduceMHC(hidden_size=hidden, hc_mult=args.hc, max_num_tokens=cap,
                                      tuning=tuning)
                else:
                    op = AllReduceMHC.virtual_ranks(tp=tp, hidden_size=hidden,
                                                    hc_mult=args.hc, max_num_tokens=cap,
                                                    tuning=tuning)
                for m in args.tokens:
                    sets, _ = _sets(args.rotate_mb, m, args.hc, hidden, tp)
                    calls = max(args.calls, sets) if tp == 1 else min(max(args.calls, sets),
                                                                       VIRTUAL_MAX_CALLS)
                    d = _inputs(sets, m, args.hc, hidden, seed=m)
                    xs = [torch.randn(sets, m, hidden, device="cuda").to(torch.bfloat16)
                          for _ in range(tp)]

                    def call(i, op=op, d=d, xs=xs):
                        out = (d["res_out"][i], d["layer"][i])
                        if tp == 1:
                            op(xs[0][i], d["residual"][i], d["post"][i], d["comb"][i],
                               d["pre"][i], d["weight"], args.eps, out=out)
                        else:
                            op([x[i] for x in xs], d["residual"][i], d["post"][i],
                               d["comb"][i], d["pre"][i], d["weight"], args.eps,
                               outs=[out] * tp)
                    call(0)
                    torch.cuda.synchronize()
                    _check(d["res_out"][0], d["layer"][0], [x[0] for x in xs], d, 0, args.eps,
                           tuning.rank_lanes)
                    s = median_p10_p90(time_graph(rotating(call, sets), calls, args.replays))
                    rows.append((m, tuning, s))
                    # as measured (a run cut short by a timeout keeps these)
                    print("measured " + _sweep_row(hidden, tp, m, tuning, s, ""), flush=True)
            for m in args.tokens:
                best = min((r for r in rows if r[0] == m), key=lambda r: r[2][0])
                for _, tuning, s in (r for r in rows if r[0] == m):
                    mark = ("*" if tuning == chosen else "") + ("<" if tuning == best[1] else "")
                    row = _sweep_row(hidden, tp, m, tuning, s, mark)
                    print(row, flush=True)
                    lines.append(row)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.all_reduce_mhc")
    p.add_argument("--tokens", type=int_list, default=None,
                   help="default 1,8,16,64 (compare) / 1,16,64 (sweep)")
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--hc", type=int, default=4)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=None,
                   help="default 200 (compare) / 50 (sweep)")
    p.add_argument("--budget-ns", type=int, default=1_000_000_000)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0,
                   help="rotate through input sets spanning at least this many MB")
    p.add_argument("--sweep", action="store_true", help="the tuning sweep instead")
    p.add_argument("--sweep-tp", type=int_list, default=[1],
                   help="tp values of the sweep (tp > 1: virtual ranks, relative only)")
    p.add_argument("--clusters", type=int_list, default=None,
                   help="sweep: only these cluster sizes (default 1..8)")
    p.add_argument("--threads", type=int_list, default=None,
                   help="sweep: only these threads a CTA (default 64..1024)")
    p.add_argument("--rank-lanes", type=int_list, default=None,
                   help="sweep: only these rank lanes (default every one dividing tp)")
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--results", type=Path, default=None,
                   help="compare mode: also write the timings as profile rows here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    args.tokens = args.tokens or ([1, 16, 64] if args.sweep else [1, 8, 16, 64])
    args.replays = args.replays or (50 if args.sweep else 200)
    lines = sweep(args) if args.sweep else compare(args)
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, hc={args.hc}, "
            f"calls/graph=max({args.calls}, input sets), replays={args.replays}, "
            f"inputs rotated over >= {args.rotate_mb:g} MB"
            + ("" if args.sweep else f", budget_ns={args.budget_ns}")
            + (f", tp > 1 rows: virtual ranks on one GPU (relative only), at most "
               f"{VIRTUAL_MAX_CALLS} calls a graph"
               if args.sweep and max(args.sweep_tp) > 1 else ""))
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
