"""Benchmark: the fused indexer kernel vs the two-step path vs the stock chain.

    python -m benchmarks.indexer [--k 7168] [--heads 64,32] [--tokens 1,2,4,8,16,32,64]
        [--replays 30] [--rotate-mb 120] [--sweep] [--markdown PATH]

Per (K, heads, tokens), each side is one CUDA graph of R back-to-back calls,
call i using indexer module i % R (its own weights) and input set i % R, with
R chosen so the weights a graph reads span at least ``--rotate-mb`` (more than
the H200's 50 MB L2): no call finds its weights in L2. Each replay is timed
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

``--sweep`` also times the projection kernel alone for every tactic that tiles
K (the tactic table's measurement) and prints the fastest per token count.
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

SWEEP_TACTICS = ((16, 1), (8, 1), (16, 2), (8, 2), (4, 4), (8, 4), (4, 8))


def _time_graph(step, calls: int, replays: int) -> float:
    """Median microseconds per call of ``step(i)``, i = 0..calls-1 captured
    in one graph (the harness's :func:`~cluster.measure.graph.time_graph`)."""
    for i in range(calls):  # every module's first call eagerly (compile, occupancy query)
        step(i)
    return median_p10_p90(time_graph(rotating(step, calls), calls, max(2, replays)))[0]


def read_bandwidth(gib: float = 2.0, replays: int = 10) -> float:
    """Bytes per second of a ``torch.sum`` over a ``gib`` GiB BF16 buffer."""
    buf = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda")
    us = _time_graph(lambda i: buf.sum(dtype=torch.float32), 1, replays)
    del buf
    return gib * 2**30 / (us * 1e-6)


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.indexer")
    p.add_argument("--k", type=int_list, default=[7168])
    p.add_argument("--heads", type=int_list, default=[64, 32])
    p.add_argument("--tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--rotate-mb", type=float, default=120.0)
    p.add_argument("--sweep", action="store_true", help="time every tactic of the projection")
    p.add_argument("--sweep-tokens", type=int_list, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--markdown", default=None, help="also write the tables here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False

    from kernels.indexer.layout import Tactic, padded_heads
    from kernels.indexer.projection import IndexerProjection
    from kernels.indexer.stage import Indexer, _fuse, stock_indexer_query

    bw = read_bandwidth()
    tiny = torch.zeros(1, device="cuda")
    node_us = _time_graph(lambda i: tiny.add_(1), 32, args.replays)
    lines = [f"read bandwidth (torch.sum over 2 GiB BF16): {bw / 1e12:.2f} TB/s",
             f"graph node floor (a 1-element torch add_, back to back, no PDL): {node_us:.2f} us"]
    print("\n".join(lines), flush=True)
    header = (f"{'K':>5} {'heads':>5} {'M':>3} {'fused_us':>9} {'two_step':>9} {'proj_us':>8} "
              f"{'stock_us':>9} {'kernels':>7} {'floor_us':>8} {'stock/fused':>11} "
              f"{'fused/floor':>11} {'two/fused':>9} {'fuse()':>6}")
    lines += [header, "-" * len(header)]
    print(header + "\n" + lines[-1], flush=True)
    sweep_lines = []
    for k in args.k:
        for heads in args.heads:
            rows = 128 + heads + 128
            weight_bytes = rows * k * 2
            sets = max(2, math.ceil(args.rotate_mb * 2**20 / weight_bytes))
            mods = [Indexer(hidden=k, q_lora_rank=64, heads=heads, device="cuda",
                            generator=torch.Generator().manual_seed(i)) for i in range(sets)]
            projs = [IndexerProjection(m) for m in mods]
            padded = padded_heads(heads)
            scale = mods[0].softmax_scale * heads ** -0.5
            floor = weight_bytes / bw * 1e6
            for m in args.tokens:
                g = torch.Generator().manual_seed(m)
                xs = torch.randn(sets, m, k, generator=g).to(torch.bfloat16).cuda()
                qs = torch.randn(sets, m, heads * 128, generator=g).to(torch.bfloat16).cuda()

                def fused(i):
                    j = i % sets
                    return projs[j].fused(xs[j], qs[j], mods[j].k_norm, scale, padded)

                def two_step(i):
                    j = i % sets
                    kk, w, gate = projs[j](xs[j])
                    return stock_indexer_query(qs[j], kk, w, mods[j].k_norm, scale, padded)

                def proj(i):
                    j = i % sets
                    return projs[j](xs[j])

                def stock(i):
                    j = i % sets
                    kk, w, gate = mods[j].stock_projection(xs[j])
                    return stock_indexer_query(qs[j], kk, w, mods[j].k_norm, scale, padded)

                t_fused = (_time_graph(fused, sets, args.replays)
                           if m <= projs[0].fused_max_tokens else float("nan"))
                t_two = _time_graph(two_step, sets, args.replays)
                t_proj = _time_graph(proj, sets, args.replays)
                t_stock = _time_graph(stock, sets, args.replays)
                kernels, other = kernel_count(lambda: stock(0))
                row = (f"{k:>5} {heads:>5} {m:>3} {t_fused:>9.2f} {t_two:>9.2f} {t_proj:>8.2f} "
                       f"{t_stock:>9.2f} {f'{kernels}+{other}':>7} {floor:>8.2f} "
                       f"{t_stock / t_fused:>11.2f} {t_fused / floor:>11.2f} "
                       f"{t_two / t_fused:>9.2f} {str(_fuse(m, heads, 'sm_90')):>6}")
                print(row, flush=True)
                lines.append(row)
                if args.sweep and heads == args.heads[0] and m in args.sweep_tokens:
                    got = []
                    for w, s in SWEEP_TACTICS:
                        t = Tactic(w, s)
                        if k % t.k_multiple or t.smem_bytes(m) > 232_448:
                            continue
                        us = _time_graph(lambda i, t=t: projs[i % sets](xs[i % sets], tactic=t),
                                         sets, args.replays)
                        got.append((us, t))
                    got.sort(key=lambda r: r[0])
                    text = ", ".join(f"w{t.warps}s{t.split} {us:.2f}" for us, t in got)
                    sweep_lines.append(f"K={k} M={m:>3}: {text}")
                    print("  sweep " + sweep_lines[-1], flush=True)
            del mods, projs
            torch.cuda.empty_cache()
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, replays={args.replays}, "
            f"weights and inputs rotated over >= {args.rotate_mb:g} MB, times in us per call "
            f"(median), kernels = kernels+memsets of one stock call")
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines + sweep_lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
