"""Benchmark: fused Lamport publish + norm vs torch add + rms_norm, tp=1.

    python -m benchmarks.all_reduce_norm [--tokens 1,8,16,64] [--hidden 5120,7168]
        [--calls 50] [--replays 200] [--watchdog-ns 1000000000] [--markdown PATH]

Each side is one CUDA graph holding max(``--calls``, R) back-to-back calls (so graph
launch overhead is amortised); each replay is timed with CUDA events and the
per-call time is replay time / calls. Inputs rotate: call i of a graph reads
input set i % R, with R sets spanning at least ``--rotate-mb`` (default twice
the H200's 60 MB L2), so neither side is timed on L2-resident inputs. Reported: medians (and p10/p90) over
``--replays`` replays in microseconds, the fused/torch ratio, and the
watchdog variant's overhead over the plain consumer. tp=1 only: virtual-rank
timings are not a collective's speed (every peer store lands in local L2).
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from benchmarks.timing import int_list, median_p10_p90, rotating, rotation_sets, time_graph


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.all_reduce_norm")
    p.add_argument("--tokens", type=int_list, default=[1, 8, 16, 64])
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--watchdog-ns", type=int, default=1_000_000_000)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0,
                   help="rotate through input sets spanning at least this many MB")
    p.add_argument("--markdown", default=None, help="also write the table here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark needs a CUDA GPU", file=sys.stderr)
        return 2

    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    header = (f"{'hidden':>6} {'M':>4} {'fused_us':>9} {'p10':>7} {'p90':>7} {'torch_us':>9} "
              f"{'ratio':>6} {'watchdog_us':>11} {'wd_overhead':>11} {'rotated_mb':>10}")
    lines = [header, "-" * len(header)]
    print(header)
    print(lines[1])
    cap = max(args.tokens)
    for hidden in args.hidden:
        plain = AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps)
        wd = AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps,
                           watchdog_ns=args.watchdog_ns)
        for m in args.tokens:
            g = torch.Generator(device="cpu").manual_seed(m)
            set_bytes = 4 * m * hidden * 2  # x, residual, and the two outputs
            sets = rotation_sets(args.rotate_mb, set_bytes)
            calls = max(args.calls, sets)  # every set is read once per replay
            xs = torch.randn(sets, m, hidden, generator=g).to(torch.bfloat16).cuda()
            residuals = torch.randn(sets, m, hidden, generator=g).to(torch.bfloat16).cuda()
            weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
            outs = torch.empty(2, sets, m, hidden, dtype=torch.bfloat16, device="cuda")
            # correctness once, before timing
            plain(xs[0], residuals[0], weight, out=(outs[0, 0], outs[1, 0]))
            torch.cuda.synchronize()
            ref_norm, ref_res = all_reduce_norm([xs[0]], residuals[0], weight, args.eps)
            assert_bit_exact(outs[1, 0], ref_res, "residual_out")
            assert_within_ulp(outs[0, 0], ref_norm, 1, "norm_out")

            def rotate(call):  # call(x, residual, out) over the input sets
                return rotating(lambda i: call(xs[i], residuals[i], (outs[0, i], outs[1, i])),
                                sets)

            def torch_pair(x, residual, out):  # outputs come from the graph's pool
                s = x + residual
                return torch.nn.functional.rms_norm(s, (hidden,), weight, args.eps), s

            fused = median_p10_p90(time_graph(rotate(lambda x, r, o: plain(x, r, weight, out=o)),
                                       calls, args.replays))
            watchdog = median_p10_p90(time_graph(rotate(lambda x, r, o: wd(x, r, weight, out=o)),
                                          calls, args.replays))
            ref = median_p10_p90(time_graph(rotate(torch_pair), calls, args.replays))
            assert plain.mailbox.is_all_sentinel() and wd.mailbox.is_all_sentinel()
            row = (f"{hidden:>6} {m:>4} {fused[0]:>9.2f} {fused[1]:>7.2f} {fused[2]:>7.2f} "
                   f"{ref[0]:>9.2f} {fused[0] / ref[0]:>6.2f} {watchdog[0]:>11.2f} "
                   f"{(watchdog[0] / fused[0] - 1) * 100:>10.1f}% {sets * set_bytes / 2**20:>10.0f}")
            print(row, flush=True)
            lines.append(row)
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"calls/graph=max({args.calls}, input sets), replays={args.replays}, watchdog_ns={args.watchdog_ns}, "
            f"inputs rotated over >= {args.rotate_mb:g} MB")
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join(lines) + "\n" + meta + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
