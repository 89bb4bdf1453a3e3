"""Benchmark: the fused indexer kernel vs the two-step path vs the stock chain.

    python -m benchmarks.indexer [--k 7168] [--heads 64,32] [--tokens 1,2,4,8,16,32,64]
        [--replays 30] [--rotate-mb 120] [--sweep] [--sweep-tokens 1,16] [--no-stock]
        [--ncu-calls N] [--ncu-proj 16x1,4x8] [--variants NAME,...] [--markdown PATH]

Per (K, heads, tokens), each side is one CUDA graph of max(R, 32)
back-to-back calls, call i using indexer module i % R (its own weights) and
input set i % R, with R chosen so the weights a graph reads span at least
``--rotate-mb`` (by default more than the H200's 50 MB L2): no call finds its
weights in L2. A small ``--rotate-mb`` (1: two modules) keeps them in L2
instead, which separates the kernel's fixed time from its weight stream. Each replay is timed
with CUDA events; per-call time = replay / R; medians over ``--replays``.
Printed per token count:

- ``fused``: ``IndexerProjection.fused`` (one kernel);
- ``two_step``: the projection kernel, then the query epilogue as torch ops;
- ``proj``: the projection kernel alone (its table tactic);
- ``stock``: the stock chain (BF16 wk GEMM, FP32 copy of x against the FP32
  weights_proj copy, gate GEMM, then indexer_query as torch ops; TF32 off)
  and its kernel count from the profiler (one eager call);
- ``floor``: weight bytes / the read bandwidth measured here (a graph of
  ``torch.sum`` over a 2 GiB buffer);
- ``stock/fused`` and ``fused/floor``; also the time a trivial kernel takes
  per node of such a graph (a 1-element ``add_``), the fixed cost any
  one-kernel path pays on top of its weight reads.

``--sweep`` also times the fused kernel's candidates side by side with the
table's (:data:`kernels.indexer.layout.FUSED_CANDIDATES`; one row each, the
table's marked ``*``) and, at ``--sweep-tokens``, the projection kernel
alone for every tactic of :data:`SWEEP_TACTICS` that tiles K, each as built
(``launch_dependents`` after its PDL wait) and with ``launch_dependents``
first (``+launch``: the next call's CTAs may take the SMs this one leaves and
issue their weight loads while it runs), fastest first.

Roofline columns (the fused kernel): ``MB`` = :func:`kernels.indexer.layout.
fused_min_bytes` (each weight row once, x, q, the norm parameters, the
outputs), ``roof_us`` = MB / :data:`HBM_PEAK` (the H200 datasheet's 4.8 TB/s:
a bound no kernel beats, so the ratio is conservative; the measured
``torch.sum`` bandwidth is printed too, and ``floor_us``/``fused/floor`` keep
issue 19's target measure: weight bytes at that measured bandwidth),
``x_roof`` = fused / roof_us, ``TB/s`` = MB / fused (achieved), ``wMB`` =
weight bytes the kernel reads (zero rows included unless skipped).

``--variants`` times the named fused candidates beside the table's, without
the projection sweep; it also takes the names of
:data:`kernels.indexer.layout.TIMING_PROBES` (the spread grids without their
key exchange: a wrong key by design, timed to tell the exchange's cost from
the grid's; never run by anything else). ``--no-stock`` leaves out the stock chain and the two-step path (their torch
op graphs are most of the run time); ``--ncu-calls N`` times nothing: it runs
each fused candidate (and the ``--ncu-proj`` tactics) N times eagerly per
case and prints the launch order, a target for ``scripts/gpu/indexer_ncu.sh``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys

import torch

from benchmarks import int_list
from cluster.measure.graph import rotating, time_graph
from cluster.measure.stats import median_p10_p90

#: (warps, split) of the projection sweep: the table's, then finer split-K
#: (more CTAs in flight: 40 CTAs x 16 warps up to 640 CTAs x 2 warps at K 7168).
SWEEP_TACTICS = ((16, 1), (8, 1), (16, 2), (8, 2), (4, 4), (8, 4), (4, 8), (2, 8), (2, 16),
                 (1, 16))
#: Calls in a timed graph at the least, whatever the rotation: with fewer the
#: graph's own launch shows in the per-call time (a ``--rotate-mb`` small
#: enough for the weights to stay in L2 would make it 2 calls).
MIN_CALLS = 32
#: H200 HBM3e peak read bandwidth by the datasheet (bytes/s): the roofline.
HBM_PEAK = 4.8e12


def time_calls(step, calls: int, replays: int) -> float:
    """Median microseconds per call of ``step(i)``, i = 0..calls-1 captured
    in one graph (the harness's :func:`~cluster.measure.graph.time_graph`)."""
    for i in range(calls):  # every module's first call eagerly (compile, occupancy query)
        step(i)
    return median_p10_p90(time_graph(rotating(step, calls), calls, max(2, replays)))[0]


def read_bandwidth(gib: float = 2.0, replays: int = 10) -> float:
    """Bytes per second of a ``torch.sum`` over a ``gib`` GiB BF16 buffer."""
    buf = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda")
    us = time_calls(lambda i: buf.sum(dtype=torch.float32), 1, replays)
    del buf
    return gib * 2**30 / (us * 1e-6)


def graph_node_us(replays: int) -> float:
    """Microseconds per node of a graph of 32 one-element ``add_`` kernels."""
    tiny = torch.zeros(1, device="cuda")
    return time_calls(lambda i: tiny.add_(1), 32, replays)


def kernel_count(fn) -> tuple[int, int]:
    """(kernels, other GPU ops such as memsets/copies) of one eager call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = other = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.lower()
            if "memset" in name or "memcpy" in name:
                other += 1
            else:
                kernels += 1
    return kernels, other


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.indexer")
    p.add_argument("--k", type=int_list, default=[7168])
    p.add_argument("--heads", type=int_list, default=[64, 32])
    p.add_argument("--tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--rotate-mb", type=float, default=120.0)
    p.add_argument("--sweep", action="store_true",
                   help="time the fused candidates and every tactic of the projection")
    p.add_argument("--sweep-tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--no-stock", action="store_true",
                   help="leave out the stock chain and the two-step path")
    p.add_argument("--ncu-calls", type=int, default=0,
                   help="no timing: run each fused candidate N times eagerly (for ncu)")
    p.add_argument("--ncu-proj", default="16x1,4x8",
                   help="projection tactics WARPSxSPLIT also run under --ncu-calls")
    p.add_argument("--variants", default=None,
                   help="comma-separated fused candidate (or timing probe) names to time "
                        "beside the table's (instead of all of them with --sweep; no "
                        "projection sweep)")
    p.add_argument("--markdown", default=None, help="also write the tables here")
    args = p.parse_args(argv)
    if args.variants is not None:
        from kernels.indexer.layout import FUSED_CANDIDATES, TIMING_PROBES

        known = {v.name: v for v in FUSED_CANDIDATES + TIMING_PROBES}
        names = [n for n in args.variants.split(",") if n]
        bad = [n for n in names if n not in known]
        if bad or not names:
            p.error(f"--variants: unknown {bad or args.variants!r}; known: {sorted(known)}")
        args.variants = [known[n] for n in names]
    for name in ("k", "heads", "tokens", "sweep_tokens"):
        bad = [v for v in getattr(args, name) if v < 1]
        if bad or not getattr(args, name):
            p.error(f"--{name.replace('_', '-')} must be positive ints, got {getattr(args, name)}")
    if args.replays < 1 or args.ncu_calls < 0 or args.rotate_mb <= 0:
        p.error(f"--replays must be >= 1, --ncu-calls >= 0, --rotate-mb > 0; got "
                f"{args.replays}, {args.ncu_calls}, {args.rotate_mb}")
    try:
        tactics = [tuple(int(v) for v in t.split("x")) for t in args.ncu_proj.split(",") if t]
        if any(len(t) != 2 for t in tactics):
            raise ValueError
    except ValueError:
        p.error(f"--ncu-proj must be WARPSxSPLIT[,...], e.g. 16x1,4x8; got {args.ncu_proj!r}")
    args.ncu_proj = tactics
    return args


def roofline(us: float, min_bytes: int) -> str:
    """``roof_us x_roof TB/s`` of a fused time against :data:`HBM_PEAK`."""
    roof = min_bytes / HBM_PEAK * 1e6
    return f"{roof:>7.2f} {us / roof:>6.2f} {min_bytes / (us * 1e-6) / 1e12:>5.2f}"


def main(argv=None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False

    from kernels.indexer.layout import (FUSED_CANDIDATES, Tactic, fused_min_bytes,
                                        fused_weight_bytes_read, padded_heads)
    from kernels.indexer.projection import IndexerProjection
    from kernels.indexer.stage import Indexer, _fuse, stock_indexer_query

    nan = float("nan")
    lines = []
    if not args.ncu_calls:
        bw = read_bandwidth()
        node_us = graph_node_us(args.replays)
        lines = [f"read bandwidth (torch.sum over 2 GiB BF16): {bw / 1e12:.2f} TB/s; "
                 f"roofline peak (H200 datasheet HBM3e): {HBM_PEAK / 1e12:.1f} TB/s",
                 f"graph node floor (a 1-element torch add_, back to back, no PDL): {node_us:.2f} us"]
        print("\n".join(lines), flush=True)
        header = (f"{'K':>5} {'heads':>5} {'M':>3} {'fused':>10} {'fused_us':>9} {'wMB':>5} "
                  f"{'MB':>5} {'roof_us':>7} {'x_roof':>6} {'TB/s':>5} {'floor_us':>8} "
                  f"{'fused/floor':>11} {'proj_us':>8} {'two_step':>9} {'stock_us':>9} "
                  f"{'kernels':>7} {'stock/fused':>11} {'two/fused':>9} {'fuse()':>6}")
        lines += [header, "-" * len(header)]
        print(header + "\n" + lines[-1], flush=True)
    sweep_lines = []
    for k in args.k:
        for heads in args.heads:
            rows = 128 + heads + 128
            weight_bytes = rows * k * 2
            sets = max(2, math.ceil(args.rotate_mb * 2**20 / weight_bytes))
            calls = max(sets, MIN_CALLS)
            if args.ncu_calls:
                sets = 1
            mods = [Indexer(hidden=k, q_lora_rank=64, heads=heads, device="cuda",
                            generator=torch.Generator().manual_seed(i)) for i in range(sets)]
            projs = [IndexerProjection(m) for m in mods]
            padded = padded_heads(heads)
            scale = mods[0].softmax_scale * heads ** -0.5
            for m in args.tokens:
                # The table's variant for this cell first (marked *), the other
                # candidates with --sweep.
                table = projs[0].fused_variant_for(m)
                candidates = [(table.name + "*", table)]
                if args.variants is not None:
                    candidates += [(v.name, v) for v in args.variants if v != table]
                elif args.sweep or args.ncu_calls:
                    candidates += [(v.name, v) for v in FUSED_CANDIDATES if v != table]
                g = torch.Generator().manual_seed(m)
                xs = torch.randn(sets, m, k, generator=g).to(torch.bfloat16).cuda()
                qs = torch.randn(sets, m, heads * 128, generator=g).to(torch.bfloat16).cuda()

                def fused(i, variant=table):
                    j = i % sets
                    return projs[j].fused(xs[j], qs[j], mods[j].k_norm, scale, padded,
                                          variant=variant)

                def two_step(i):
                    j = i % sets
                    kk, w, gate = projs[j](xs[j])
                    return stock_indexer_query(qs[j], kk, w, mods[j].k_norm, scale, padded)

                def proj(i, t=None, early=False):
                    j = i % sets
                    return projs[j](xs[j], tactic=t, early_launch=early)

                def stock(i):
                    j = i % sets
                    kk, w, gate = mods[j].stock_projection(xs[j])
                    return stock_indexer_query(qs[j], kk, w, mods[j].k_norm, scale, padded)

                # The variants that run m tokens (the key-first one runs one tile).
                candidates = [(n, v) for n, v in candidates if v.runs(m)]
                fits = m <= projs[0].fused_max_tokens
                if args.ncu_calls:
                    for name, variant in candidates if fits else ():
                        print(f"ncu launch: fused {name} K={k} heads={heads} M={m} "
                              f"x{args.ncu_calls}", flush=True)
                        for _ in range(args.ncu_calls):
                            fused(0, variant)
                    for w, sp in args.ncu_proj:
                        t = Tactic(w, sp)
                        if k % t.k_multiple or t.smem_bytes(m) > 232_448:
                            continue
                        print(f"ncu launch: projection w{w}s{sp} K={k} heads={heads} M={m} "
                              f"x{args.ncu_calls}", flush=True)
                        for _ in range(args.ncu_calls):
                            proj(0, t)
                    torch.cuda.synchronize()
                    continue
                min_bytes = fused_min_bytes(m, k, 128, heads, 128, padded)
                floor = weight_bytes / bw * 1e6
                t_proj = time_calls(proj, calls, args.replays)
                t_two = t_stock = nan
                kernels = other = 0
                if not args.no_stock:
                    t_two = time_calls(two_step, calls, args.replays)
                    t_stock = time_calls(stock, calls, args.replays)
                    kernels, other = kernel_count(lambda: stock(0))
                for name, variant in candidates:
                    t_fused = (time_calls(lambda i, v=variant: fused(i, v), calls, args.replays)
                               if fits else nan)
                    w_read = fused_weight_bytes_read(k, 128, heads, 128,
                                                     skip_zero=variant.skip_zero)
                    row = (f"{k:>5} {heads:>5} {m:>3} {name:>10} {t_fused:>9.2f} "
                           f"{w_read / 1e6:>5.2f} {min_bytes / 1e6:>5.2f} "
                           f"{roofline(t_fused, min_bytes)} {floor:>8.2f} "
                           f"{t_fused / floor:>11.2f} {t_proj:>8.2f} {t_two:>9.2f} "
                           f"{t_stock:>9.2f} {f'{kernels}+{other}':>7} "
                           f"{t_stock / t_fused:>11.2f} {t_two / t_fused:>9.2f} "
                           f"{str(_fuse(m, heads, 'sm_90')):>6}")
                    print(row, flush=True)
                    lines.append(row)
                if args.sweep and heads == args.heads[0] and m in args.sweep_tokens:
                    got = []
                    for w, sp in SWEEP_TACTICS:
                        t = Tactic(w, sp)
                        if k % t.k_multiple or t.smem_bytes(m) > 232_448:
                            continue
                        for early in (False, True):
                            us = time_calls(lambda i, t=t, e=early: proj(i, t, e), calls,
                                             args.replays)
                            got.append((us, f"w{w}s{sp}" + ("+launch" if early else "")))
                    got.sort(key=lambda r: r[0])
                    text = ", ".join(f"{name} {us:.2f}" for us, name in got)
                    sweep_lines.append(f"K={k} heads={heads} M={m:>3}: {text}")
                    print("  sweep projection " + sweep_lines[-1], flush=True)
            del mods, projs
            torch.cuda.empty_cache()
    if args.ncu_calls:
        return 0
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, replays={args.replays}, "
            f"weights and inputs rotated over >= {args.rotate_mb:g} MB, times in us per call "
            f"(median); fused = the fused variant timed (* = the tactic table's; "
            f"skip-zero: no loads of the layout's zero rows; early: slot codes and norm "
            f"parameters loaded before the PDL wait; split-k/split-k2: a cluster's CTAs split K, "
            f"one/two row groups a warp; spread: 2-3 rows a CTA over 128 CTAs, the key's "
            f"LayerNorm through a global mailbox); MB = fused_min_bytes, roof_us = MB / {HBM_PEAK / 1e12:.1f} TB/s, "
            f"TB/s = MB / fused_us; kernels = kernels+memsets of one stock call")
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines + sweep_lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
