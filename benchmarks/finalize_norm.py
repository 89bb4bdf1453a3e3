"""Benchmark: MoE finalize fused into the Lamport publish + norm vs the
unfused torch path, tp=1.

    python -m benchmarks.finalize_norm [--tokens 1,8,16,64] [--hidden 5120,7168]
        [--top-k 8] [--calls 50] [--replays 200] [--markdown PATH]

fused = ``AllReduceNorm.__call__(MoEOutput, residual, norm_weight)``: the
finalize publish (top-k weighted sum + shared expert, 8-byte fragments by
default, ``--e8`` adds the 16-byte tuning) PDL-chained with the norm
consumer. torch = the unfused path a tp=1 model runs: gather the routed
rows, weighted sum in FP32, + shared expert, round to BF16, + residual,
``torch.nn.functional.rms_norm``. Both with FP32 and BF16 routing weights;
every route held (tp=1 owns every expert). Timing as in
:mod:`benchmarks.all_reduce_norm`: one CUDA graph of ``--calls`` calls a
side (more when needed: a graph reads every input set once, so its calls
together read >= ``--rotate-mb`` MB and nothing is timed L2-resident),
median / p10 / p90 of per-call times over ``--replays`` replays,
microseconds.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from benchmarks import int_list
from cluster.measure.graph import rotating, rotation_sets, time_graph
from cluster.measure.stats import median_p10_p90
from cluster.measure.workloads.norm import torch_finalize


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.finalize_norm")
    p.add_argument("--tokens", type=int_list, default=[1, 8, 16, 64])
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0)
    p.add_argument("--e8", action="store_true", help="also time 16-byte fragments")
    p.add_argument("--markdown", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2

    from kernels.all_reduce_norm import AllReduceNorm, FinalizeTuning, MoEOutput, RoutedExperts
    from kernels.reference.moe import all_reduce_norm_finalize
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    k = args.top_k
    header = (f"{'hidden':>6} {'M':>4} {'weights':>7} {'fused_us':>9} {'p10':>7} {'p90':>7} "
              f"{'torch_us':>9} {'ratio':>6}" + (f" {'fused_e8_us':>11} {'ratio_e8':>8}"
                                                 if args.e8 else ""))
    lines = [header, "-" * len(header)]
    print(header)
    print(lines[1])
    cap = max(args.tokens)
    for hidden in args.hidden:
        ops = {4: AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps, top_k=k)}
        if args.e8:
            ops[8] = AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps,
                                   top_k=k, finalize_tuning=FinalizeTuning(elements_per_thread=8))
        for m in args.tokens:
            for wdtype in (torch.float32, torch.bfloat16):
                g = torch.Generator(device="cuda").manual_seed(m)
                set_bytes = (m * k + 4) * hidden * 2  # routed rows, shared, residual, 2 outs
                sets = rotation_sets(args.rotate_mb, set_bytes)
                calls = max(args.calls, sets)  # a graph walks every set once at least
                gemm2 = torch.randn(sets, m * k, hidden, generator=g, device="cuda").to(
                    torch.bfloat16)
                weights = torch.rand(sets, m, k, generator=g, device="cuda").to(wdtype)
                idx = torch.stack([torch.randperm(m * k, generator=g, device="cuda")
                                   for _ in range(sets)]).to(torch.int32).view(sets, m, k)
                shared = torch.randn(sets, m, hidden, generator=g, device="cuda").to(
                    torch.bfloat16)
                residual = torch.randn(sets, m, hidden, generator=g, device="cuda").to(
                    torch.bfloat16)
                nw = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(
                    torch.bfloat16)
                outs = torch.empty(2, sets, m, hidden, dtype=torch.bfloat16, device="cuda")
                moes = [MoEOutput(RoutedExperts(gemm2[i], weights[i], idx[i]), shared[i])
                        for i in range(sets)]
                # correctness once, before timing
                for op in ops.values():
                    op(moes[0], residual[0], nw, out=(outs[0, 0], outs[1, 0]))
                    torch.cuda.synchronize()
                    ref_norm, ref_res = all_reduce_norm_finalize([moes[0].to_partial()],
                                                                 residual[0], nw, args.eps)
                    assert_bit_exact(outs[1, 0], ref_res, "residual_out")
                    assert_within_ulp(outs[0, 0], ref_norm, 1, "norm_out")

                def fused(op):
                    return lambda i: op(moes[i], residual[i], nw, out=(outs[0, i], outs[1, i]))

                def torch_path(i):
                    s = torch_finalize(gemm2[i], weights[i], idx[i], shared[i]) + residual[i]
                    return torch.nn.functional.rms_norm(s, (hidden,), nw, args.eps), s

                t_fused = median_p10_p90(time_graph(rotating(fused(ops[4]), sets), calls, args.replays))
                t_torch = median_p10_p90(time_graph(rotating(torch_path, sets), calls, args.replays))
                row = (f"{hidden:>6} {m:>4} {str(wdtype).split('.')[-1]:>7} {t_fused[0]:>9.2f} "
                       f"{t_fused[1]:>7.2f} {t_fused[2]:>7.2f} {t_torch[0]:>9.2f} "
                       f"{t_fused[0] / t_torch[0]:>6.2f}")
                if args.e8:
                    t8 = median_p10_p90(time_graph(rotating(fused(ops[8]), sets), calls, args.replays))
                    row += f" {t8[0]:>11.2f} {t8[0] / t_torch[0]:>8.2f}"
                for op in ops.values():
                    assert op.mailbox.is_all_sentinel()
                print(row, flush=True)
                lines.append(row)
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, top_k={k}, "
            f"calls/graph=max({args.calls}, input sets), replays={args.replays}, "
            f"inputs rotated over >= {args.rotate_mb:g} MB")
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
